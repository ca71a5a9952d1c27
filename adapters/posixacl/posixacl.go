// Package posixacl grants and revokes one user's access to a file with a
// POSIX access ACL entry, keeping every other entry: several VMs' users
// read one image, and the disk tools' user is granted a file for one run.
// Changes of one file are serialised across processes by an flock on it
// (regular files and directories).
package posixacl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"

	"golang.org/x/sys/unix"
)

// Perm bits of an entry.
const (
	Read    uint16 = 4
	Write   uint16 = 2
	Execute uint16 = 1 // search, on a directory
)

const (
	xattrName = "system.posix_acl_access"
	version   = 2

	tagUserObj  = 0x01
	tagUser     = 0x02
	tagGroupObj = 0x04
	tagGroup    = 0x08
	tagMask     = 0x10
	tagOther    = 0x20

	undefinedID = 0xffffffff
)

type entry struct {
	tag, perm uint16
	id        uint32
}

// Grant gives uid perm on the file at path (replacing an entry uid had).
func Grant(path string, uid uint32, perm uint16) error {
	return change(path, func(es []entry) []entry {
		for i := range es {
			if es[i].tag == tagUser && es[i].id == uid {
				es[i].perm = perm
				return es
			}
		}
		return append(es, entry{tagUser, perm, uid})
	})
}

// Revoke removes uid's entry from the file at path; a file whose ACL
// then holds no named entry goes back to its plain mode.
func Revoke(path string, uid uint32) error {
	return change(path, func(es []entry) []entry {
		out := es[:0]
		for _, e := range es {
			if e.tag != tagUser || e.id != uid {
				out = append(out, e)
			}
		}
		return out
	})
}

// Users lists the users that have entries on the file, with their perms.
func Users(path string) (map[uint32]uint16, error) {
	es, _, err := read(path)
	if err != nil {
		return nil, err
	}
	out := map[uint32]uint16{}
	for _, e := range es {
		if e.tag == tagUser {
			out[e.id] = e.perm
		}
	}
	return out, nil
}

func change(path string, edit func([]entry) []entry) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if st.Mode().IsRegular() || st.IsDir() {
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("lock %s: %w", path, err)
		}
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			return fmt.Errorf("lock %s: %w", path, err)
		}
	}
	es, mode, err := read(path)
	if err != nil {
		return err
	}
	es = edit(es)
	named := false
	var groupObj, mask uint16
	kept := es[:0]
	for _, e := range es {
		switch e.tag {
		case tagUser, tagGroup:
			named = true
			mask |= e.perm
		case tagGroupObj:
			groupObj = e.perm
			mask |= e.perm
		case tagMask:
			continue // recomputed
		}
		kept = append(kept, e)
	}
	if !named {
		// Back to the plain mode: no ACL, the group bits the owning
		// group's (the mask had taken their place).
		if err := unix.Removexattr(path, xattrName); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove the ACL of %s: %w", path, err)
		}
		return unix.Chmod(path, mode&^0o070|uint32(groupObj)<<3)
	}
	kept = append(kept, entry{tagMask, mask, undefinedID})
	sort.SliceStable(kept, func(i, j int) bool {
		if kept[i].tag != kept[j].tag {
			return kept[i].tag < kept[j].tag
		}
		return kept[i].id < kept[j].id
	})
	buf := binary.LittleEndian.AppendUint32(nil, version)
	for _, e := range kept {
		buf = binary.LittleEndian.AppendUint16(buf, e.tag)
		buf = binary.LittleEndian.AppendUint16(buf, e.perm)
		buf = binary.LittleEndian.AppendUint32(buf, e.id)
	}
	if err := unix.Setxattr(path, xattrName, buf, 0); err != nil {
		return fmt.Errorf("set the ACL of %s: %w", path, err)
	}
	return nil
}

// read returns the file's access ACL, made from its mode when it has
// none, and its permission bits.
func read(path string) ([]entry, uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, 0, err
	}
	mode := st.Mode & 0o7777
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(path, xattrName, buf)
	switch {
	case errors.Is(err, unix.ENODATA):
		return []entry{
			{tagUserObj, uint16(mode >> 6 & 7), undefinedID},
			{tagGroupObj, uint16(mode >> 3 & 7), undefinedID},
			{tagOther, uint16(mode & 7), undefinedID},
		}, mode, nil
	case err != nil:
		return nil, 0, fmt.Errorf("read the ACL of %s: %w", path, err)
	}
	buf = buf[:n]
	if len(buf) < 4 || binary.LittleEndian.Uint32(buf) != version || (len(buf)-4)%8 != 0 {
		return nil, 0, fmt.Errorf("the ACL of %s is not of version %d", path, version)
	}
	var es []entry
	for b := buf[4:]; len(b) >= 8; b = b[8:] {
		es = append(es, entry{binary.LittleEndian.Uint16(b), binary.LittleEndian.Uint16(b[2:]), binary.LittleEndian.Uint32(b[4:])})
	}
	// The owning group's entry: with a mask, the mode's group bits are
	// the mask's, and the entry keeps the group's own perms.
	return es, mode, nil
}
