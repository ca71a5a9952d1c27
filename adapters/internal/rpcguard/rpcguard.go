// Package rpcguard keeps a panic in one gRPC call from taking the daemon
// down: the call fails with codes.Internal and the panic, with its stack,
// goes to the log at error level.
package rpcguard

import (
	"context"
	"path"
	"runtime/debug"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Unary recovers a panic in a unary handler. Chain it innermost, so that
// the outer interceptors see the call fail as any other.
func Unary(log logrus.FieldLogger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp interface{}, err error) {
		defer func() {
			if p := recover(); p != nil {
				resp, err = nil, panicked(log, info.FullMethod, p)
			}
		}()
		return handler(ctx, req)
	}
}

// Stream recovers a panic in a streaming handler.
func Stream(log logrus.FieldLogger) grpc.StreamServerInterceptor {
	return func(srv interface{}, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = panicked(log, info.FullMethod, p)
			}
		}()
		return handler(srv, ss)
	}
}

// panicked logs the panic and returns the caller's error, which names
// neither the panic's value nor the stack (they may quote request data).
func panicked(log logrus.FieldLogger, method string, p interface{}) error {
	log.WithFields(logrus.Fields{"method": path.Base(method), "panic": p, "stack": string(debug.Stack())}).Error("gRPC call panicked; the daemon goes on")
	return status.Errorf(codes.Internal, "%s: internal error in the daemon (a panic, logged with its stack in the daemon's log)", path.Base(method))
}
