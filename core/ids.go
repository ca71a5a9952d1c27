package core

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// SandboxID derives a sandbox's ID from the pod's identity, so that
// kubelet's retries of RunPodSandbox find the sandbox they already made
// while a new attempt gets a new one.
func SandboxID(namespace, name, uid string, attempt uint32) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00%s\x00%d", namespace, name, uid, attempt)))
	return hex.EncodeToString(sum[:])
}

// newContainerID returns a random 64-hex-digit ID.
func newContainerID() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("read random bytes: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// lookupPrefix resolves an ID or a unique prefix of one, as crictl and
// kubectl users type them.
func lookupPrefix[T any](items map[string]T, id string) (string, bool, error) {
	if id == "" {
		return "", false, nil
	}
	if _, ok := items[id]; ok {
		return id, true, nil
	}
	match := ""
	for key := range items {
		if strings.HasPrefix(key, id) {
			if match != "" {
				return "", false, fmt.Errorf("ID prefix %q is ambiguous", id)
			}
			match = key
		}
	}
	return match, match != "", nil
}
