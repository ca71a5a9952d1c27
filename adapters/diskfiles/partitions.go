package diskfiles

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sort"
	"strings"
)

const sector = 512

// partitions reads a disk's MBR or GPT partition table (512-byte sectors)
// and lists its partitions, Linux ones first; none when it has no table.
// Logical partitions of an MBR's extended partition are not listed. Every
// partition lies inside the disk.
func partitions(disk *io.SectionReader) ([]part, error) {
	mbr := make([]byte, sector)
	if _, err := disk.ReadAt(mbr, 0); err != nil {
		return nil, nil // smaller than a sector: no table
	}
	if mbr[510] != 0x55 || mbr[511] != 0xaa {
		return nil, nil
	}
	var parts []part
	gpt := false
	for i := 0; i < 4; i++ {
		e := mbr[446+16*i:]
		typ := e[4]
		start, count := int64(binary.LittleEndian.Uint32(e[8:])), int64(binary.LittleEndian.Uint32(e[12:]))
		switch {
		case typ == 0xee:
			gpt = true
		case typ == 0 || count == 0 || typ == 0x05 || typ == 0x0f || typ == 0x85: // empty or extended
		default:
			parts = append(parts, part{start: start * sector, size: count * sector, num: i + 1, ptype: fmt.Sprintf("%x", typ)})
		}
	}
	if gpt {
		var err error
		if parts, err = gptPartitions(disk); err != nil {
			return nil, err
		}
	}
	var inside []part
	for _, p := range parts {
		if p.start > 0 && p.size > 0 && p.start+p.size <= disk.Size() {
			inside = append(inside, p)
		}
	}
	sort.SliceStable(inside, func(i, j int) bool { return linux(inside[i].ptype) && !linux(inside[j].ptype) })
	return inside, nil
}

// linux reports a Linux partition type: MBR 83, GPT Linux data, GPT
// x86-64 root.
func linux(t string) bool {
	return t == "83" || t == "0fc63daf-8483-4772-8e79-3d69d8477de4" || t == "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"
}

func gptPartitions(disk *io.SectionReader) ([]part, error) {
	h := make([]byte, 92)
	if _, err := disk.ReadAt(h, sector); err != nil {
		return nil, fmt.Errorf("GPT header: %w", err)
	}
	if !bytes.Equal(h[:8], []byte("EFI PART")) {
		return nil, fmt.Errorf("a protective MBR without a GPT header")
	}
	lba, n, size := int64(binary.LittleEndian.Uint64(h[72:])), int64(binary.LittleEndian.Uint32(h[80:])), int64(binary.LittleEndian.Uint32(h[84:]))
	if n > 256 || size < 128 || size > 4096 {
		return nil, fmt.Errorf("GPT of %d entries of %d bytes", n, size)
	}
	table := make([]byte, n*size)
	if _, err := disk.ReadAt(table, lba*sector); err != nil {
		return nil, fmt.Errorf("GPT entries: %w", err)
	}
	var parts []part
	for i := int64(0); i < n; i++ {
		e := table[i*size:]
		if bytes.Equal(e[:16], make([]byte, 16)) {
			continue
		}
		first, last := int64(binary.LittleEndian.Uint64(e[32:])), int64(binary.LittleEndian.Uint64(e[40:]))
		if first <= 0 || last < first || last > 1<<40 {
			continue
		}
		parts = append(parts, part{start: first * sector, size: (last - first + 1) * sector, num: int(i) + 1, ptype: guid(e[:16])})
	}
	return parts, nil
}

// guid formats a GPT type GUID (its first three fields little-endian).
func guid(b []byte) string {
	s := fmt.Sprintf("%08x-%04x-%04x-%x-%x", binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint16(b[4:]),
		binary.LittleEndian.Uint16(b[6:]), b[8:10], b[10:16])
	return strings.ToLower(s)
}
