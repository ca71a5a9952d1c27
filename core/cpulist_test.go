package core

import (
	"reflect"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{"", nil, false},
		{"1", []int{1}, false},
		{"0-2,5", []int{0, 1, 2, 5}, false},
		{" 3, 1-2 ,2", []int{1, 2, 3}, false},
		{"2-1", nil, true},
		{"a", nil, true},
		{"-1", nil, true},
		{"1,,2", nil, true},
		{"9000", nil, true},
	} {
		got, err := ParseCPUList(tc.in)
		if (err != nil) != tc.bad || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, %v", tc.in, got, err)
		}
	}
}
