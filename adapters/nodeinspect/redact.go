package nodeinspect

import "regexp"

// Redacted replaces a secret's value.
const Redacted = "<redacted>"

// secretValues find the secret values QEMU's logs and the node's command
// lines may hold. libvirt gives QEMU a disk's credentials (a Ceph key) as
// a secret object whose data is encrypted with the domain's master key
// (a root-only file) and names it by id elsewhere: the data is no use
// without the key, and still does not leave the node. Cloud-init user
// data is on the VM's ISO, never on a command line. Any other program's
// option whose name says it holds a secret has its value replaced.
var secretValues = []struct {
	re   *regexp.Regexp
	repl string
}{
	// -object '{"qom-type":"secret","id":"…","data":"…",…}' (libvirt ≥ 7.2)
	{regexp.MustCompile(`("qom-type"\s*:\s*"secret"[^{}]*?"data"\s*:\s*")[^"]*`), "${1}" + Redacted},
	{regexp.MustCompile(`("data"\s*:\s*")[^"]*("[^{}]*?"qom-type"\s*:\s*"secret")`), "${1}" + Redacted + "${2}"},
	// -object secret,id=…,data=…,keyid=… (older libvirt)
	{regexp.MustCompile(`(\bsecret,(?:[^\s,]*,)*?data=)[^\s,]*`), "${1}" + Redacted},
	// --password=…, -token …, --db-secret …
	{regexp.MustCompile(`(?im)((?:^|\s)--?[a-z0-9_.-]*?(?:password|passwd|secret|token)[a-z0-9_.-]*(?:=|\s+))[^\s,'"]+`), "${1}" + Redacted},
	// password=… inside an option's value or a URL's query
	{regexp.MustCompile(`(?i)(\b(?:password|passwd|secret|token)=)[^\s,&'"]+`), "${1}" + Redacted},
}

// redact replaces the secret values in text.
func redact(text string) string {
	for _, s := range secretValues {
		text = s.re.ReplaceAllString(text, s.repl)
	}
	return text
}
