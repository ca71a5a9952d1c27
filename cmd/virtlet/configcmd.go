package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// configCommand runs `virtlet config default|validate` and returns the
// exit status.
func configCommand(args []string, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintf(stderr, "usage: virtlet config default            print the default configuration file\n"+
			"       virtlet config validate [FLAGS]   check --config FILE and flags as the daemon would, print the result\n")
		return 2
	}
	if len(args) == 0 {
		return usage()
	}
	switch args[0] {
	case "default":
		if len(args) > 1 {
			return usage()
		}
		if err := writeConfigFile(stdout, defaults()); err != nil {
			fmt.Fprintln(stderr, "virtlet config default:", err)
			return 1
		}
		return 0
	case "validate":
		cfg, _, err := parseConfig(args[1:])
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		if err != nil {
			fmt.Fprintln(stderr, "virtlet config validate:", strings.ReplaceAll(err.Error(), "\n", "\n  "))
			return 1
		}
		if err := writeConfigFile(stdout, cfg); err != nil {
			fmt.Fprintln(stderr, "virtlet config validate:", err)
			return 1
		}
		return 0
	case "-h", "--help", "help":
		usage()
		return 0
	}
	return usage()
}

// writeConfigFile writes cfg as a config file, each key under its help.
func writeConfigFile(w io.Writer, cfg config) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Virtlet daemon configuration (docs/configuration.md); flags override it.\napiVersion: %s\nkind: %s\n", cfg.APIVersion, cfg.Kind)
	v := reflect.ValueOf(cfg)
	for _, f := range configFields() {
		value, err := yaml.Marshal(map[string]interface{}{f.Key: v.Field(f.index).Interface()})
		if err != nil {
			return fmt.Errorf("key %s: %w", f.Key, err)
		}
		b.WriteString("\n")
		for _, line := range wrap(f.Help, 74) {
			fmt.Fprintf(&b, "# %s\n", line)
		}
		b.Write(value)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// wrap splits text into lines of at most width characters, at spaces.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len(line)+1+len(word) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// configReference is docs/configuration.md's table of keys.
func configReference() string {
	var b strings.Builder
	b.WriteString("| Key | Flag | Default | Meaning |\n|---|---|---|---|\n")
	def := reflect.ValueOf(defaults())
	for _, f := range configFields() {
		d := f.Default
		if d == "" {
			switch v := def.Field(f.index).Interface().(type) {
			case string:
				d = "`" + v + "`"
				if v == "" {
					d = "empty"
				}
			default:
				d = fmt.Sprintf("`%v`", v)
			}
		}
		fmt.Fprintf(&b, "| `%s` | `--%s` | %s | %s |\n", f.Key, f.Flag, d, strings.ReplaceAll(f.Help, "|", "\\|"))
	}
	return b.String()
}
