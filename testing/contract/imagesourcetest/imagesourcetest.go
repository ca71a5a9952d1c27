// Package imagesourcetest is the contract every ports.ImageSource must meet.
package imagesourcetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/virtlet/virtlet/ports"
	"github.com/virtlet/virtlet/testing/harness"
)

// Env is an image source under test.
type Env struct {
	Source ports.ImageSource
	// Location serves an image; Missing is a location that does not exist.
	Location, Missing string
}

// Run checks the contract.
func Run(t *testing.T, env Env) {
	ctx := context.Background()
	dir := harness.SearchableTempDir(t)
	t.Run("fetch writes the data and reports its digest and size", func(t *testing.T) {
		dest := filepath.Join(dir, "image")
		res, err := env.Source.Fetch(ctx, ports.FetchRequest{Name: "test", Location: env.Location, Dest: dest})
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(dest)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		if res.Digest != "sha256:"+hex.EncodeToString(sum[:]) || res.Size != int64(len(data)) || res.Size == 0 {
			t.Fatalf("result %+v for %d bytes", res, len(data))
		}
	})
	t.Run("a missing image is ErrNotFound", func(t *testing.T) {
		_, err := env.Source.Fetch(ctx, ports.FetchRequest{Name: "test", Location: env.Missing, Dest: filepath.Join(dir, "missing")})
		if !errors.Is(err, ports.ErrNotFound) {
			t.Fatalf("err %v", err)
		}
	})
}
