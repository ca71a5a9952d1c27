package annotations

import (
	"errors"
	"math"
	"math/big"
	"strconv"
)

// Kubernetes quantity suffixes (k8s.io/apimachinery's resource.Quantity
// grammar), as multipliers.
var quantitySuffixes = map[string]*big.Rat{
	"":  big.NewRat(1, 1),
	"n": big.NewRat(1, 1_000_000_000), "u": big.NewRat(1, 1_000_000), "m": big.NewRat(1, 1000),
	"k": pow(10, 3), "M": pow(10, 6), "G": pow(10, 9), "T": pow(10, 12), "P": pow(10, 15), "E": pow(10, 18),
	"Ki": pow(2, 10), "Mi": pow(2, 20), "Gi": pow(2, 30), "Ti": pow(2, 40), "Pi": pow(2, 50), "Ei": pow(2, 60),
}

func pow(base, exp int64) *big.Rat {
	return new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(base), big.NewInt(exp), nil))
}

var (
	errNotQuantity = errors.New("not a quantity")
	errNotBytes    = errors.New("not a positive whole number of bytes")
)

// ParseBytes reads a Kubernetes quantity (1Gi, 512Mi, 10G, 1.5Gi, 1e9) as
// a whole, positive number of bytes that fits an int64. It follows the
// grammar of apimachinery's resource.ParseQuantity, whose package the core
// cannot import (it carries generated protobuf code).
func ParseBytes(s string) (int64, error) {
	num, suffix := splitQuantity(s)
	if num == "" {
		return 0, errNotQuantity
	}
	value, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, errNotQuantity
	}
	if mult, ok := quantitySuffixes[suffix]; ok {
		value.Mul(value, mult)
	} else if len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E') {
		exp, rest := splitQuantity(suffix[1:])
		e, err := strconv.ParseInt(exp, 10, 64)
		if rest != "" || err != nil {
			return 0, errNotQuantity
		}
		if e > 30 || e < -30 { // far beyond int64, or below one byte
			return 0, errNotBytes
		}
		if e >= 0 {
			value.Mul(value, pow(10, e))
		} else {
			value.Quo(value, pow(10, -e))
		}
	} else {
		return 0, errNotQuantity
	}
	if !value.IsInt() || value.Sign() <= 0 || value.Num().Cmp(big.NewInt(math.MaxInt64)) > 0 {
		return 0, errNotBytes
	}
	return value.Num().Int64(), nil
}

// splitQuantity splits a quantity into its signed decimal number and its
// suffix.
func splitQuantity(s string) (num, suffix string) {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return "", ""
	}
	return s[:i], s[i:]
}
