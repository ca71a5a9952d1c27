//go:build !failpoints

package main

import "github.com/sirupsen/logrus"

// failpointHook: a release build has no failpoints (failpoints.go).
func failpointHook(logrus.FieldLogger) func(string) { return nil }
