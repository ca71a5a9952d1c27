package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// newKey writes a key pair as dir/name and dir/name.pub; the private
// file's content does not matter to the choice.
func newKey(t *testing.T, dir, name string) ssh.PublicKey {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if dir != "" {
		os.WriteFile(filepath.Join(dir, name), []byte("private"), 0o600)
		os.WriteFile(filepath.Join(dir, name+".pub"), ssh.MarshalAuthorizedKey(k), 0o644)
	}
	return k
}

func TestChooseIdentity(t *testing.T) {
	dir := t.TempDir()
	newKey(t, dir, "id_ed25519")
	vmKey := newKey(t, dir, "vm_key")
	other := newKey(t, "", "")
	annotation := "# admins\n" + string(ssh.MarshalAuthorizedKey(other)) + "not a key\n" + string(ssh.MarshalAuthorizedKey(vmKey))
	keys := parseKeys(annotation)
	if len(keys) != 2 {
		t.Fatalf("parsed %d keys from the annotation, want 2", len(keys))
	}
	for _, tc := range []struct {
		name, identity string
		keys           []ssh.PublicKey
		want, warning  string
	}{
		{name: "the pod's key found under any name", keys: keys, want: filepath.Join(dir, "vm_key")},
		{name: "no keys in the pod: ssh's own choice", keys: nil, want: ""},
		{name: "the user's -i wins", identity: filepath.Join(dir, "vm_key"), keys: keys, want: filepath.Join(dir, "vm_key")},
		{name: "a -i the pod does not accept is used, with a warning", identity: filepath.Join(dir, "id_ed25519"), keys: keys,
			want: filepath.Join(dir, "id_ed25519"), warning: "id_ed25519.pub is not among the keys the pod puts into its VM (SHA256:"},
		{name: "no matching key: a warning", keys: []ssh.PublicKey{other}, want: "",
			warning: "none of the keys in " + dir + " is among those the pod puts into its VM (" + ssh.FingerprintSHA256(other)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var warned string
			got := chooseIdentity(tc.identity, dir, tc.keys, func(m string) { warned = m })
			if got != tc.want {
				t.Errorf("identity %q, want %q", got, tc.want)
			}
			if tc.warning == "" && warned != "" || !strings.Contains(warned, tc.warning) {
				t.Errorf("warning %q, want one with %q", warned, tc.warning)
			}
		})
	}
}
