package diskfiles

import (
	"fmt"
	"io"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/virtlet/virtlet/ports"
)

// part is a candidate file system: a partition, or the whole disk (num 0).
type part struct {
	start, size int64 // bytes, from the start of the file or device
	num         int
	ptype       string
}

func (p part) String() string {
	if p.num == 0 {
		return "the whole disk"
	}
	return fmt.Sprintf("partition %d (type %s)", p.num, p.ptype)
}

// findRoot finds the ext2/3/4 file system holding /etc and /usr (or
// /bin) on the disk at p (a slice from offset, of size when not 0).
func (w *writer) findRoot(p string, offset, size int64) (part, error) {
	if strings.Contains(p, "?") {
		return part{}, fmt.Errorf("disk path %q holds a '?', which debugfs reads as options: %w", p, ports.ErrInvalidArgument)
	}
	f, err := os.Open(p)
	if err != nil {
		return part{}, err
	}
	end, err := f.Seek(0, io.SeekEnd)
	if err == nil && size == 0 {
		size = end - offset
	}
	var parts []part
	if err == nil {
		parts, err = partitions(io.NewSectionReader(f, offset, size))
	}
	f.Close()
	if err != nil {
		return part{}, fmt.Errorf("read the partition table: %w", err)
	}
	if len(parts) == 0 {
		parts = []part{{size: size}}
	}
	var tried []string
	for _, c := range parts {
		c.start += offset
		fsType, err := w.probe(p, c)
		switch {
		case err != nil:
			tried = append(tried, c.String()+": "+err.Error())
		case fsType != "":
			tried = append(tried, fmt.Sprintf("%s: %s", c, fsType))
		default:
			return c, nil
		}
	}
	return part{}, fmt.Errorf("the disk holds no Linux root file system that can be written without mounting it "+
		"(an ext2, ext3 or ext4 file system with /etc and /usr or /bin): %s: %w", strings.Join(tried, "; "), ports.ErrFailedPrecondition)
}

// probe tells why c is not a root file system ("" when it is one).
func (w *writer) probe(dev string, c part) (string, error) {
	out, stderr, err := w.tool.Run(w.ctx, map[string]uint16{dev: 4}, "debugfs", "-c", "-R", "ls -p /", image(dev, c))
	if err != nil {
		return "", err
	}
	if msg := debugfsErrors(stderr); msg != "" || len(out) == 0 {
		// Not ext2/3/4: name what it is, for the message.
		typ, _, _ := w.tool.Run(w.ctx, map[string]uint16{dev: 4}, "blkid", "-p", "-o", "value", "-s", "TYPE",
			"-O", strconv.FormatInt(c.start, 10), "-S", strconv.FormatInt(c.size, 10), dev)
		if t := strings.TrimSpace(string(typ)); t != "" {
			return "a " + t + " file system, which only a host mount could write", nil
		}
		return "no file system", nil
	}
	entries := map[string]byte{} // name → 'd' directory, 'l' symlink, 'f' other
	for _, line := range strings.Split(string(out), "\n") {
		// /inode/mode/uid/gid/name/size/
		fields := strings.Split(line, "/")
		if len(fields) < 7 {
			continue
		}
		mode, err := strconv.ParseUint(fields[2], 8, 32)
		if err != nil {
			continue
		}
		kind := byte('f')
		switch mode & 0o170000 {
		case 0o040000:
			kind = 'd'
		case 0o120000:
			kind = 'l'
		}
		entries[fields[5]] = kind
	}
	if entries["etc"] != 'd' || !(entries["usr"] == 'd' || entries["bin"] == 'd' || entries["bin"] == 'l') {
		return "no /etc", nil
	}
	return "", nil
}

// image names the file system of c on dev as e2fsprogs takes it.
func image(dev string, c part) string {
	if c.start == 0 {
		return dev
	}
	return fmt.Sprintf("%s?offset=%d", dev, c.start)
}

// debugfsErrors is what debugfs said on standard error but its banner:
// it exits 0 when a command fails.
func debugfsErrors(stderr []byte) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(stderr)), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "debugfs ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

// inode is what debugfs's stat tells of a file.
type inode struct {
	kind     string // regular, directory, symlink, FIFO, socket, character special, block special
	mode     uint32 // permission bits
	uid, gid int
	size     int64
	link     string // a symlink's target
}

var (
	statType  = regexp.MustCompile(`Type: ([a-zA-Z ]+?)\s+Mode:\s+(0[0-7]+)`)
	statOwner = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+)`)
	statSize  = regexp.MustCompile(`\sSize: (\d+)`)
	statLink  = regexp.MustCompile(`Fast link dest: "(.*)"`)
)

// stat reads the inode at p in the file system; nil when there is none.
func (w *writer) stat(dev string, c part, p string) (*inode, error) {
	out, stderr, err := w.tool.Run(w.ctx, map[string]uint16{dev: 4}, "debugfs", "-c", "-R", `stat "`+p+`"`, image(dev, c))
	if err != nil {
		return nil, err
	}
	if msg := debugfsErrors(stderr); msg != "" {
		if strings.Contains(msg, "File not found") {
			return nil, nil
		}
		return nil, fmt.Errorf("debugfs stat %s: %s", p, msg)
	}
	s := string(out)
	t, o, z := statType.FindStringSubmatch(s), statOwner.FindStringSubmatch(s), statSize.FindStringSubmatch(s)
	if t == nil || o == nil || z == nil {
		return nil, fmt.Errorf("debugfs stat %s: unexpected output %q", p, s)
	}
	in := &inode{kind: t[1]}
	mode, _ := strconv.ParseUint(t[2], 8, 32)
	in.mode = uint32(mode)
	in.uid, _ = strconv.Atoi(o[1])
	in.gid, _ = strconv.Atoi(o[2])
	in.size, _ = strconv.ParseInt(z[1], 10, 64)
	if in.kind == "symlink" {
		if l := statLink.FindStringSubmatch(s); l != nil {
			in.link = l[1]
		} else {
			// A slow symlink: its target is its data.
			target, _, err := w.tool.Run(w.ctx, map[string]uint16{dev: 4}, "debugfs", "-c", "-R", `cat "`+p+`"`, image(dev, c))
			if err != nil {
				return nil, err
			}
			in.link = string(target)
		}
	}
	return in, nil
}

// debugfs runs a debugfs script writing the file system.
func (w *writer) debugfs(dev string, c part, grants map[string]uint16, script string) error {
	s, err := w.file("script", []byte(script))
	if err != nil {
		return err
	}
	grants[s], grants[dev] = 4, 6
	_, stderr, err := w.tool.Run(w.ctx, grants, "debugfs", "-w", "-f", s, image(dev, c))
	if err != nil {
		return err
	}
	if msg := debugfsErrors(stderr); msg != "" {
		return fmt.Errorf("debugfs: %s", msg)
	}
	return nil
}

// maxLinks bounds the symlinks one path may follow, as the kernel's.
const maxLinks = 40

// resolve follows p through the image's directories and symlinks, inside
// the image's root, and makes the directories of p that are missing. It
// returns the path of the file to write (its parent a directory) and its
// inode, nil when there is none. A symlink's target must exist up to its
// last component.
func (w *writer) resolve(dev string, c part, p string) (string, *inode, error) {
	type comp struct {
		name   string
		create bool // a component of p itself, not of a symlink's target
	}
	var comps []comp
	for _, n := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		comps = append(comps, comp{n, true})
	}
	cur, links := "/", 0
	for i := 0; i < len(comps); i++ {
		name := comps[i].name
		if name == "" || name == "." {
			continue
		}
		next := path.Join(cur, name) // ".." stops at the image's root
		if name == ".." {
			cur = next
			continue
		}
		in, err := w.stat(dev, c, next)
		if err != nil {
			return "", nil, err
		}
		last := i == len(comps)-1
		switch {
		case in == nil && last:
			return next, nil, nil
		case in == nil && !comps[i].create:
			return "", nil, fmt.Errorf("%s, where a symlink of the image leads, does not exist in the image: %w", next, ports.ErrFailedPrecondition)
		case in == nil:
			if err := w.debugfs(dev, c, map[string]uint16{}, fmt.Sprintf("mkdir \"%[1]s\"\nsif \"%[1]s\" mode 040755\nsif \"%[1]s\" uid 0\nsif \"%[1]s\" gid 0\n", next)); err != nil {
				return "", nil, fmt.Errorf("make directory %s: %w", next, err)
			}
			cur = next
		case in.kind == "symlink":
			if links++; links > maxLinks {
				return "", nil, fmt.Errorf("%s: more than %d symlinks: %w", p, maxLinks, ports.ErrFailedPrecondition)
			}
			var target []comp
			for _, n := range strings.Split(in.link, "/") {
				target = append(target, comp{n, false})
			}
			if last {
				// The file a final symlink names is written; its own
				// name is created when missing.
				target[len(target)-1].create = true
			}
			if strings.HasPrefix(in.link, "/") {
				cur = "/"
			}
			comps = append(target, comps[i+1:]...)
			i = -1
		case last:
			return next, in, nil
		case in.kind != "directory":
			return "", nil, fmt.Errorf("%s is a %s in the image, not a directory: %w", next, in.kind, ports.ErrFailedPrecondition)
		default:
			cur = next
		}
	}
	return "", nil, &ports.InvalidError{Field: "file path", Value: p, Allowed: "a path to a file"}
}

// writeFiles writes each file, root's, with its mode (0644 when none).
func (w *writer) writeFiles(dev string, c part, files []ports.GuestFile) error {
	for _, f := range files {
		if err := w.writeFile(dev, c, f); err != nil {
			return fmt.Errorf("write %s: %w", describe(f), err)
		}
	}
	return nil
}

func (w *writer) writeFile(dev string, c part, f ports.GuestFile) error {
	p, _ := guestPath(f.Path)
	target, in, err := w.resolve(dev, c, p)
	if err != nil {
		return err
	}
	if in != nil && in.kind != "regular" {
		return fmt.Errorf("the image holds a %s there, not a regular file: %w", in.kind, ports.ErrFailedPrecondition)
	}
	mode := uint32(f.Mode.Perm())
	if mode == 0 {
		mode = 0o644
	}
	content, err := w.file("content", f.Data)
	if err != nil {
		return err
	}
	dir, name := path.Dir(target), path.Base(target)
	script := fmt.Sprintf("cd \"%s\"\n", dir)
	if in != nil {
		script += fmt.Sprintf("rm \"%s\"\n", name)
	}
	script += fmt.Sprintf("write \"%[1]s\" \"%[2]s\"\nsif \"%[2]s\" mode 0100%[3]o\nsif \"%[2]s\" uid 0\nsif \"%[2]s\" gid 0\n", content, name, mode)
	if err := w.debugfs(dev, c, map[string]uint16{content: 4}, script); err != nil {
		return err
	}
	got, err := w.stat(dev, c, target)
	if err != nil {
		return err
	}
	if got == nil || got.kind != "regular" || got.mode != mode || got.uid != 0 || got.gid != 0 || got.size != int64(len(f.Data)) {
		return fmt.Errorf("debugfs left %s as %+v, not a regular file of root's, mode %o, %d bytes", target, got, mode, len(f.Data))
	}
	return nil
}
