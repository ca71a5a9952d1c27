package rpcguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtlet/virtlet/adapters/internal/rpcguard"
)

func TestAPanicFailsTheCallOnly(t *testing.T) {
	log, hook := test.NewNullLogger()
	unary := rpcguard.Unary(log)
	info := &grpc.UnaryServerInfo{FullMethod: "/runtime.v1.RuntimeService/CreateContainer"}
	resp, err := unary(context.Background(), "req", info, func(ctx context.Context, req interface{}) (interface{}, error) {
		var m map[string]int
		m["boom"]++ // a nil map write: a runtime panic
		return "never", nil
	})
	if resp != nil || status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "CreateContainer: internal error") {
		t.Fatalf("after a panic: %v %v", resp, err)
	}
	e := hook.LastEntry()
	if e == nil || e.Level != logrus.ErrorLevel || !strings.Contains(e.Data["stack"].(string), "rpcguard_test") {
		t.Fatalf("the panic is not logged at error level with its stack: %+v", e)
	}
	// Calls that do not panic pass through untouched.
	want := errors.New("plain failure")
	if resp, err := unary(context.Background(), "req", info, func(context.Context, interface{}) (interface{}, error) { return "r", want }); resp != "r" || err != want {
		t.Fatalf("a plain call: %v %v", resp, err)
	}

	stream := rpcguard.Stream(log)
	err = stream(nil, nil, &grpc.StreamServerInfo{FullMethod: "/runtime.v1.RuntimeService/GetContainerEvents"}, func(interface{}, grpc.ServerStream) error {
		panic("stream handler bug")
	})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "GetContainerEvents") || strings.Contains(err.Error(), "stream handler bug") {
		t.Fatalf("after a stream panic: %v", err)
	}
}
