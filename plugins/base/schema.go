package base

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/invopop/jsonschema"

	"github.com/virtlet/virtlet/ports"
)

// ConfigSchema is the JSON Schema of an adapter's manifest config, made
// from its DefaultConfig: the type gives the keys, their types and
// descriptions (jsonschema_description tags), the value the defaults. An
// adapter that takes no config (no Configurer) gets a schema that allows
// no key; a Configurer that declares nothing gets none (nil).
func ConfigSchema(a ports.Describer) ([]byte, error) {
	d, ok := a.(ports.ConfigDefaulter)
	if !ok {
		if _, configurable := a.(ports.Configurer); configurable {
			return nil, nil
		}
		return json.Marshal(&jsonschema.Schema{Version: jsonschema.Version, Type: "object", AdditionalProperties: jsonschema.FalseSchema,
			Description: "this plugin takes no config"})
	}
	def := d.DefaultConfig()
	if t := reflect.TypeOf(def); t == nil || t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("DefaultConfig returns a %T: want a struct", def)
	}
	r := &jsonschema.Reflector{DoNotReference: true, ExpandedStruct: true, RequiredFromJSONSchemaTags: true}
	s := r.Reflect(def)
	s.ID = ""
	defaults, err := json.Marshal(def)
	if err != nil {
		return nil, fmt.Errorf("default config: %w", err)
	}
	var values map[string]any
	if err := json.Unmarshal(defaults, &values); err != nil {
		return nil, fmt.Errorf("default config: %w", err)
	}
	setDefaults(s, values)
	return json.Marshal(s)
}

// setDefaults gives each property of s its value in values, descending
// into objects.
func setDefaults(s *jsonschema.Schema, values map[string]any) {
	if s.Properties == nil {
		return
	}
	for key, prop := range s.Properties.FromOldest() {
		v, ok := values[key]
		if !ok {
			// Left out by omitempty: a zero number or false.
			switch prop.Type {
			case "integer", "number":
				prop.Default = 0
			case "boolean":
				prop.Default = false
			}
			continue
		}
		if nested, isObject := v.(map[string]any); isObject && prop.Properties != nil {
			setDefaults(prop, nested)
			continue
		}
		prop.Default = v
	}
}
