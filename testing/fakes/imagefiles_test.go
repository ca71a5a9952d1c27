package fakes_test

import (
	"testing"

	"github.com/virtlet/virtlet/testing/contract/imagefilestest"
	"github.com/virtlet/virtlet/testing/fakes"
)

func TestImageFilesContract(t *testing.T) {
	imagefilestest.Run(t, fakes.NewImageFiles(t.TempDir()))
}
