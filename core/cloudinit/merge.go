package cloudinit

import "sigs.k8s.io/yaml"

// Merge combines user-data documents as cloud-init does by default
// (docs/cloud-init.md): mappings merge key by key, recursively; lists are appended;
// any other value of the later document replaces the earlier one. Neither
// argument is modified.
func Merge(base, over map[string]interface{}) map[string]interface{} {
	out := copyMap(base)
	for k, v := range over {
		out[k] = mergeValue(out[k], v)
	}
	return out
}

func mergeValue(base, over interface{}) interface{} {
	switch o := over.(type) {
	case map[string]interface{}:
		if b, ok := base.(map[string]interface{}); ok {
			return Merge(b, o)
		}
	case []interface{}:
		if b, ok := base.([]interface{}); ok {
			out := append([]interface{}{}, copyValue(b).([]interface{})...)
			return append(out, copyValue(o).([]interface{})...)
		}
	}
	return copyValue(over)
}

func copyMap(m map[string]interface{}) map[string]interface{} {
	if m == nil {
		return map[string]interface{}{}
	}
	return copyValue(m).(map[string]interface{})
}

// copyValue deep-copies a decoded YAML/JSON value.
func copyValue(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, e := range t {
			m[k] = copyValue(e)
		}
		return m
	case []interface{}:
		l := make([]interface{}, len(t))
		for i, e := range t {
			l[i] = copyValue(e)
		}
		return l
	default:
		return v
	}
}

// yamlOf renders a value, for comparisons in tests and logs.
func yamlOf(v interface{}) (string, error) {
	b, err := yaml.Marshal(v)
	return string(b), err
}
