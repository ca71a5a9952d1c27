package cri

import (
	"context"
	"errors"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/virtlet/virtlet/core"
	"github.com/virtlet/virtlet/ports"
)

func (s *Server) PullImage(ctx context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	var auth *ports.RegistryAuth
	if a := req.GetAuth(); a != nil {
		auth = &ports.RegistryAuth{Username: a.Username, Password: a.Password, Auth: a.Auth,
			ServerAddress: a.ServerAddress, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	}
	ref, err := s.rt.PullImage(ctx, req.GetImage().GetImage(), auth)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PullImageResponse{ImageRef: ref}, nil
}

func (s *Server) ImageStatus(ctx context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	img, err := s.rt.ImageStatus(ctx, req.GetImage().GetImage())
	switch {
	case errors.Is(err, ports.ErrNotFound):
		return &runtimeapi.ImageStatusResponse{}, nil // CRI: absent image, no error
	case err != nil:
		return nil, err
	}
	resp := &runtimeapi.ImageStatusResponse{Image: criImage(&img)}
	if req.Verbose {
		resp.Info = jsonInfo(map[string]interface{}{"location": img.Location, "format": img.Format, "pulledAt": img.PulledAt})
	}
	return resp, nil
}

func (s *Server) ListImages(ctx context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	imgs, err := s.rt.ListImages(ctx, req.GetFilter().GetImage().GetImage())
	if err != nil {
		return nil, err
	}
	out := make([]*runtimeapi.Image, 0, len(imgs))
	for i := range imgs {
		out = append(out, criImage(&imgs[i]))
	}
	return &runtimeapi.ListImagesResponse{Images: out}, nil
}

func (s *Server) RemoveImage(ctx context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	return &runtimeapi.RemoveImageResponse{}, s.rt.RemoveImage(ctx, req.GetImage().GetImage())
}

func (s *Server) ImageFsInfo(ctx context.Context, req *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	u, err := s.rt.ImageFsInfo(ctx)
	if err != nil {
		return nil, err
	}
	fs := &runtimeapi.FilesystemUsage{
		Timestamp: u.Timestamp.UnixNano(), FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: u.Mountpoint},
		UsedBytes: &runtimeapi.UInt64Value{Value: u.UsedBytes}, InodesUsed: &runtimeapi.UInt64Value{Value: u.InodesUsed},
	}
	return &runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{fs}}, nil
}

func criImage(img *core.Image) *runtimeapi.Image {
	return &runtimeapi.Image{
		Id: img.ID, RepoTags: img.RepoTags(), RepoDigests: img.RepoDigests(), Size: uint64(img.Size),
		Spec: &runtimeapi.ImageSpec{Image: img.ID},
	}
}
