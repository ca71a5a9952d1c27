package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// CheckConfig checks the manifest's config against the JSON Schema its
// plugin declares (PluginInfo.ConfigSchema), and returns every problem as
// an *Error naming the manifest file and the key (config.pool.size). An
// empty schema checks nothing: the plugin declares none.
func (m Manifest) CheckConfig(schema []byte) error {
	if len(schema) == 0 {
		return nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return fmt.Errorf("plugin %s declares a config schema that is not JSON: %w", m.Name, err)
	}
	const url = "plugin-config.json"
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, doc); err != nil {
		return fmt.Errorf("plugin %s declares a bad config schema: %w", m.Name, err)
	}
	compiled, err := c.Compile(url)
	if err != nil {
		return fmt.Errorf("plugin %s declares a bad config schema: %w", m.Name, err)
	}
	config := []byte(m.Config)
	if len(bytes.TrimSpace(config)) == 0 || string(config) == "null" {
		config = []byte("{}")
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(config))
	if err != nil {
		return &Error{File: m.File, Field: "config", Reason: err.Error()}
	}
	err = compiled.Validate(inst)
	var invalid *jsonschema.ValidationError
	if !errors.As(err, &invalid) {
		return err
	}
	var problems []error
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, cause := range e.Causes {
				walk(cause)
			}
			return
		}
		problems = append(problems, m.configError(doc, e)...)
	}
	walk(invalid)
	return errors.Join(problems...)
}

var printer = message.NewPrinter(language.English)

// configError words one leaf of a validation error.
func (m Manifest) configError(schema any, e *jsonschema.ValidationError) []error {
	field := "config"
	for _, tok := range e.InstanceLocation {
		if _, err := strconv.Atoi(tok); err == nil {
			field += "[" + tok + "]" // a list's item
		} else {
			field += "." + tok
		}
	}
	if extra, ok := e.ErrorKind.(*kind.AdditionalProperties); ok {
		keys := schemaKeys(schema, e.InstanceLocation)
		var errs []error
		for _, key := range extra.Properties {
			reason := "no such key"
			if len(keys) > 0 {
				reason += " (keys: " + strings.Join(keys, ", ") + ")"
			} else {
				reason += ": this takes none"
			}
			errs = append(errs, &Error{File: m.File, Field: field + "." + key, Reason: reason})
		}
		return errs
	}
	return []error{&Error{File: m.File, Field: field, Reason: e.ErrorKind.LocalizedString(printer)}}
}

// schemaKeys lists the keys the schema allows in the object at path.
func schemaKeys(schema any, path []string) []string {
	s, _ := schema.(map[string]any)
	for _, tok := range path {
		if props, ok := s["properties"].(map[string]any); ok && props[tok] != nil {
			s, _ = props[tok].(map[string]any)
		} else if items, ok := s["items"].(map[string]any); ok {
			s = items
		} else {
			return nil
		}
	}
	props, _ := s["properties"].(map[string]any)
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
