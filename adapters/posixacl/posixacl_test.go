package posixacl

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func getfacl(t *testing.T, p string) string {
	t.Helper()
	out, err := exec.Command("getfacl", "-cpn", p).CombinedOutput()
	if err != nil {
		t.Skipf("getfacl: %v %s", err, out)
	}
	return strings.Join(strings.Fields(string(out)), " ")
}

// Entries of several users come and go independently; the last one gone
// leaves the file as it was.
func TestGrantRevoke(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "image")
	os.WriteFile(f, []byte("x"), 0o600)
	for _, step := range []struct {
		do   func() error
		want string
	}{
		{func() error { return Grant(f, 2000000001, Read) }, "user::rw- user:2000000001:r-- group::--- mask::r-- other::---"},
		{func() error { return Grant(f, 2000000002, Read) }, "user::rw- user:2000000001:r-- user:2000000002:r-- group::--- mask::r-- other::---"},
		{func() error { return Grant(f, 1999999999, Read|Write) }, "user::rw- user:1999999999:rw- user:2000000001:r-- user:2000000002:r-- group::--- mask::rw- other::---"},
		{func() error { return Revoke(f, 1999999999) }, "user::rw- user:2000000001:r-- user:2000000002:r-- group::--- mask::r-- other::---"},
		{func() error { return Revoke(f, 2000000001) }, "user::rw- user:2000000002:r-- group::--- mask::r-- other::---"},
		{func() error { return Revoke(f, 2000000001) }, "user::rw- user:2000000002:r-- group::--- mask::r-- other::---"},
		{func() error { return Revoke(f, 2000000002) }, "user::rw- group::--- other::---"},
	} {
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		if got := getfacl(t, f); got != step.want {
			t.Fatalf("ACL %q, want %q", got, step.want)
		}
	}
	if st, _ := os.Stat(f); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %o after the last revoke, want 600", st.Mode().Perm())
	}
	users, err := Users(f)
	if err != nil || len(users) != 0 {
		t.Errorf("Users %v %v", users, err)
	}
	// A directory: search for one user; its group's own bits come back.
	d := filepath.Join(dir, "store")
	os.Mkdir(d, 0o750)
	if err := Grant(d, 2000000001, Execute); err != nil {
		t.Fatal(err)
	}
	if got := getfacl(t, d); got != "user::rwx user:2000000001:--x group::r-x mask::r-x other::---" {
		t.Errorf("directory ACL %q", got)
	}
	if err := Revoke(d, 2000000001); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(d); st.Mode().Perm() != 0o750 {
		t.Errorf("directory mode %o, want 750", st.Mode().Perm())
	}
	if err := Grant(filepath.Join(dir, "missing"), 1, Read); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
}
