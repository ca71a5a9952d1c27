package diskfiles

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

// mbr is a disk of size bytes with an MBR holding the given entries
// (type, start sector, sectors).
func mbr(size int, entries ...[3]uint32) []byte {
	d := make([]byte, size)
	for i, e := range entries {
		p := d[446+16*i:]
		p[4] = byte(e[0])
		binary.LittleEndian.PutUint32(p[8:], e[1])
		binary.LittleEndian.PutUint32(p[12:], e[2])
	}
	d[510], d[511] = 0x55, 0xaa
	return d
}

// gpt adds a GPT with the given partitions (type GUID bytes, first and
// last sector) behind a protective MBR.
func gpt(size int, parts ...struct {
	typ         [16]byte
	first, last uint64
}) []byte {
	d := mbr(size, [3]uint32{0xee, 1, uint32(size/512 - 1)})
	copy(d[512:], "EFI PART")
	binary.LittleEndian.PutUint64(d[512+72:], 2)
	binary.LittleEndian.PutUint32(d[512+80:], 128)
	binary.LittleEndian.PutUint32(d[512+84:], 128)
	for i, p := range parts {
		e := d[1024+128*i:]
		copy(e, p.typ[:])
		binary.LittleEndian.PutUint64(e[32:], p.first)
		binary.LittleEndian.PutUint64(e[40:], p.last)
	}
	return d
}

func TestPartitions(t *testing.T) {
	// The x86-64 root type, as a GPT stores it (first three fields
	// little-endian).
	root := [16]byte{0xe3, 0xbc, 0x68, 0x4f, 0xcd, 0xe8, 0xb1, 0x4d, 0x96, 0xe7, 0xfb, 0xca, 0xf9, 0x84, 0xb7, 0x09}
	esp := [16]byte{0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e, 0xc9, 0x3b}
	type gp = struct {
		typ         [16]byte
		first, last uint64
	}
	for _, tc := range []struct {
		name string
		disk []byte
		want []part
	}{
		{"no table", make([]byte, 4096), nil},
		{"MBR, Linux first", mbr(8<<20, [3]uint32{0x0e, 2048, 2048}, [3]uint32{0x83, 4096, 8192}),
			[]part{{4096 * 512, 8192 * 512, 2, "83"}, {2048 * 512, 2048 * 512, 1, "e"}}},
		{"MBR, extended skipped, beyond the disk dropped", mbr(4<<20, [3]uint32{0x05, 2048, 100}, [3]uint32{0x83, 2048, 1 << 20}), nil},
		{"GPT", gpt(8<<20, gp{esp, 34, 2047}, gp{root, 2048, 16383}),
			[]part{{2048 * 512, 14336 * 512, 2, "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"}, {34 * 512, 2014 * 512, 1, "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := partitions(io.NewSectionReader(bytes.NewReader(tc.disk), 0, int64(len(tc.disk))))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("partitions %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("partition %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
	// A protective MBR without a GPT header is an error, not a guess.
	d := mbr(1<<20, [3]uint32{0xee, 1, 2047})
	if _, err := partitions(io.NewSectionReader(bytes.NewReader(d), 0, int64(len(d)))); err == nil {
		t.Error("a protective MBR without a GPT was taken")
	}
}

// FuzzPartitions: no table makes the reader fail other than with an
// error, and every partition it lists lies inside the disk.
func FuzzPartitions(f *testing.F) {
	f.Add(mbr(1<<16, [3]uint32{0x83, 1, 100}))
	f.Add(gpt(1<<16, struct {
		typ         [16]byte
		first, last uint64
	}{[16]byte{1}, 34, 100}))
	f.Fuzz(func(t *testing.T, disk []byte) {
		parts, err := partitions(io.NewSectionReader(bytes.NewReader(disk), 0, int64(len(disk))))
		if err != nil {
			return
		}
		for _, p := range parts {
			if p.start <= 0 || p.size <= 0 || p.start+p.size > int64(len(disk)) {
				t.Fatalf("partition %+v outside a disk of %d bytes", p, len(disk))
			}
		}
	})
}
