package cli

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/hale-dev/hale/internal/buildinfo"
)

func TestCheckOutput(t *testing.T) {
	for _, tc := range []struct {
		o       string
		wantErr string
	}{
		{o: "table"}, {o: "wide"}, {o: "json"}, {o: "yaml"},
		{o: "", wantErr: `-o "": want table, wide, json or yaml`},
		{o: "YAML", wantErr: `-o "YAML": want table, wide, json or yaml`},
		{o: "jsonpath={.x}", wantErr: `-o "jsonpath={.x}": want table, wide, json or yaml`},
	} {
		t.Run(tc.o, func(t *testing.T) {
			err := CheckOutput(tc.o)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.EqualError(t, err, tc.wantErr)
		})
	}
}

// sample stands for what a command prints: durations already strings, as every command gives them.
type sample struct {
	Machine string `json:"machine"`
	For     string `json:"for"`
}

func TestWriteData(t *testing.T) {
	v := sample{Machine: "cp-1", For: (90 * time.Second).String()}
	for _, tc := range []struct {
		o     string
		wrote bool
		want  string
	}{
		{o: Table}, {o: Wide},
		{o: JSON, wrote: true, want: "{\n  \"machine\": \"cp-1\",\n  \"for\": \"1m30s\"\n}\n"},
		{o: YAML, wrote: true, want: "for: 1m30s\nmachine: cp-1\n"},
	} {
		t.Run(tc.o, func(t *testing.T) {
			var b bytes.Buffer
			wrote, err := WriteData(&b, tc.o, v)
			require.NoError(t, err)
			assert.Equal(t, tc.wrote, wrote)
			assert.Equal(t, tc.want, b.String())
		})
	}
}

func TestVersionCommand(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := VersionCommand("agent")
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{}, args...)) // nil would make cobra read os.Args (the test binary's flags)
		err := cmd.Execute()
		return out.String(), err
	}
	i := buildinfo.Get()

	out, err := run()
	require.NoError(t, err)
	assert.Equal(t, "agent "+i.String()+"\n", out)

	out, err = run("-o", "json")
	require.NoError(t, err)
	var got buildinfo.Info
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	assert.Equal(t, i, got)

	out, err = run("-o", "yaml")
	require.NoError(t, err)
	got = buildinfo.Info{}
	require.NoError(t, yaml.Unmarshal([]byte(out), &got))
	assert.Equal(t, i, got)

	_, err = run("-o", "xml")
	assert.EqualError(t, err, `-o "xml": want table, wide, json or yaml`)
	_, err = run("extra")
	assert.Error(t, err, "version takes no arguments")
}

func TestHelpProblems(t *testing.T) {
	root := &cobra.Command{Use: "x"}
	sub := &cobra.Command{Use: "y", Run: func(*cobra.Command, []string) {}}
	root.AddCommand(sub)
	sub.Flags().String("inventory", "", "the inventory (as `hub run --inventory`)")
	sub.Flags().String("file", "", "the FILE to read")
	sub.Flags().String("bare", "", "")
	sub.Flags().String("old", "", "")
	_ = sub.Flags().MarkDeprecated("old", "use --file")
	assert.Equal(t, []string{`x y: no examples`, `x y --bare: no usage`, `x y --inventory: its usage has backquotes, so its value is shown as "hub run --inventory"`}, HelpProblems(root))

	sub.Example = "  x y --file f.yaml -h   # read f.yaml\n  x y --inventry i.yaml | grep z\n  other --nope"
	assert.Equal(t, []string{`x y: its example "x y --inventry i.yaml" gives it --inventry, which it does not have`}, exampleProblems(sub))
}
