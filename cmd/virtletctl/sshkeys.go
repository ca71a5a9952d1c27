package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/virtlet/virtlet/core/annotations"
)

// podKeys returns the public keys the pod puts into its VM: those of its
// VirtletSSHKeys annotation and those of the object its
// VirtletSSHKeySource names (read through the API server; what cannot be
// read is said in note, and the keys found so far are still returned).
func (k *kube) podKeys(ctx context.Context, pod *corev1.Pod) (keys []ssh.PublicKey, note string) {
	keys = parseKeys(pod.Annotations[annotations.SSHKeys])
	opts, err := annotations.Parse(pod.Annotations)
	if err != nil || opts.SSHKeySource == nil {
		return keys, ""
	}
	ref := opts.SSHKeySource
	var data string
	switch ref.Kind {
	case annotations.ConfigMap:
		cm, err := k.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return keys, fmt.Sprintf("cannot read the pod's %s %s: %v", annotations.SSHKeySource, ref, err)
		}
		data = cm.Data[ref.Key]
	case annotations.Secret:
		s, err := k.client.CoreV1().Secrets(pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			return keys, fmt.Sprintf("cannot read the pod's %s %s: %v", annotations.SSHKeySource, ref, err)
		}
		data = string(s.Data[ref.Key])
	}
	return append(keys, parseKeys(data)...), ""
}

// parseKeys reads authorized_keys lines, skipping what is not a key.
func parseKeys(text string) []ssh.PublicKey {
	var keys []ssh.PublicKey
	for _, line := range strings.Split(text, "\n") {
		if k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line)); err == nil {
			keys = append(keys, k)
		}
	}
	return keys
}

// identityFor returns the private key file in dir whose public key (the
// file with .pub added) is one of keys, or "" if none is.
func identityFor(dir string, keys []ssh.PublicKey) string {
	pubs, _ := filepath.Glob(filepath.Join(dir, "*.pub"))
	sort.Strings(pubs)
	for _, pub := range pubs {
		if hasKey(keys, pub) {
			if private := strings.TrimSuffix(pub, ".pub"); fileExists(private) {
				return private
			}
		}
	}
	return ""
}

// hasKey tells whether the public key file pub holds one of keys.
func hasKey(keys []ssh.PublicKey, pub string) bool {
	b, err := os.ReadFile(pub)
	if err != nil {
		return false
	}
	mine := parseKeys(string(b))
	for _, m := range mine {
		for _, k := range keys {
			if bytes.Equal(m.Marshal(), k.Marshal()) {
				return true
			}
		}
	}
	return false
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// fingerprints lists the keys' SHA256 fingerprints, for messages.
func fingerprints(keys []ssh.PublicKey) string {
	var fs []string
	for _, k := range keys {
		fs = append(fs, ssh.FingerprintSHA256(k))
	}
	return strings.Join(fs, ", ")
}

// chooseIdentity picks the private key ssh should use for the pod: the
// user's -i, else the key in ~/.ssh that the pod accepts. It warns on
// stderr when the pod lists keys and the user's key is not among them
// (ssh would be refused unless the agent holds one of them).
func chooseIdentity(identity, sshDir string, keys []ssh.PublicKey, warn func(string)) string {
	if len(keys) == 0 {
		return identity
	}
	if identity != "" {
		if fileExists(identity+".pub") && !hasKey(keys, identity+".pub") {
			warn(fmt.Sprintf("%s.pub is not among the keys the pod puts into its VM (%s)", identity, fingerprints(keys)))
		}
		return identity
	}
	if id := identityFor(sshDir, keys); id != "" {
		return id
	}
	warn(fmt.Sprintf("none of the keys in %s is among those the pod puts into its VM (%s); ssh tries your agent's keys", sshDir, fingerprints(keys)))
	return ""
}
