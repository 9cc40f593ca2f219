// Command sbom writes an SPDX 2.3 software bill of materials (JSON) for Hale's release binaries: each
// binary a package with its SHA-256, and every Go module compiled into it (read from the binary's own
// build information, as `go version -m` prints it) a package it contains, with its version and its
// package URL. deploy/release runs it:
//
//	go run ./deploy/sbom -version v0.2.0 -o hale.spdx.json dist/*/hub dist/*/agent …
package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

func main() {
	version := flag.String("version", "", "the release's version (v1.2.3)")
	out := flag.String("o", "", "the file to write (default: standard output)")
	flag.Parse()
	if err := run(*version, *out, flag.Args(), time.Now().UTC()); err != nil {
		fmt.Fprintln(os.Stderr, "sbom:", err)
		os.Exit(1)
	}
}

func run(version, out string, binaries []string, now time.Time) error {
	if version == "" || len(binaries) == 0 {
		return errors.New("usage: sbom -version VERSION [-o FILE] BINARY (one or more)")
	}
	doc, err := Document(version, binaries, now)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if out == "" {
		_, err = os.Stdout.Write(b)
		return err
	}
	return os.WriteFile(out, b, 0o644)
}

// The SPDX 2.3 JSON fields written (https://spdx.github.io/spdx-spec/v2.3/).
type (
	document struct {
		SPDXVersion       string         `json:"spdxVersion"`
		DataLicense       string         `json:"dataLicense"`
		SPDXID            string         `json:"SPDXID"`
		Name              string         `json:"name"`
		DocumentNamespace string         `json:"documentNamespace"`
		CreationInfo      creationInfo   `json:"creationInfo"`
		Packages          []pkg          `json:"packages"`
		Relationships     []relationship `json:"relationships"`
	}
	creationInfo struct {
		Created  string   `json:"created"`
		Creators []string `json:"creators"`
	}
	pkg struct {
		SPDXID           string        `json:"SPDXID"`
		Name             string        `json:"name"`
		VersionInfo      string        `json:"versionInfo,omitempty"`
		DownloadLocation string        `json:"downloadLocation"`
		FilesAnalyzed    bool          `json:"filesAnalyzed"`
		PrimaryPurpose   string        `json:"primaryPurpose,omitempty"`
		Checksums        []checksum    `json:"checksums,omitempty"`
		ExternalRefs     []externalRef `json:"externalRefs,omitempty"`
		Comment          string        `json:"comment,omitempty"`
	}
	checksum struct {
		Algorithm     string `json:"algorithm"`
		ChecksumValue string `json:"checksumValue"`
	}
	externalRef struct {
		ReferenceCategory string `json:"referenceCategory"`
		ReferenceType     string `json:"referenceType"`
		ReferenceLocator  string `json:"referenceLocator"`
	}
	relationship struct {
		Element string `json:"spdxElementId"`
		Type    string `json:"relationshipType"`
		Related string `json:"relatedSpdxElement"`
	}
)

var idChars = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(parts ...string) string {
	return "SPDXRef-" + idChars.ReplaceAllString(strings.Join(parts, "-"), "-")
}

// Document is the SBOM of the binaries of release version, made at now.
func Document(version string, binaries []string, now time.Time) (any, error) {
	doc := document{SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: "hale-" + version,
		DocumentNamespace: "https://github.com/hale-dev/hale/releases/" + version + "/sbom",
		CreationInfo:      creationInfo{Created: now.Format(time.RFC3339), Creators: []string{"Tool: hale-deploy-sbom"}}}
	modules := map[string]pkg{}
	for _, path := range binaries {
		info, err := buildinfo.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w (a Go binary is needed)", path, err)
		}
		sum, err := fileSHA256(path)
		if err != nil {
			return nil, err
		}
		var goarch string
		for _, s := range info.Settings {
			if s.Key == "GOARCH" {
				goarch = s.Value
			}
		}
		name := filepath.Base(path)
		bin := pkg{SPDXID: spdxID("binary", name, goarch), Name: name + " (linux/" + goarch + ")", VersionInfo: version,
			DownloadLocation: "https://github.com/hale-dev/hale/releases/" + version, PrimaryPurpose: "APPLICATION",
			Checksums: []checksum{{Algorithm: "SHA256", ChecksumValue: sum}}, Comment: "built with " + info.GoVersion + " from " + info.Path}
		doc.Packages = append(doc.Packages, bin)
		doc.Relationships = append(doc.Relationships, relationship{"SPDXRef-DOCUMENT", "DESCRIBES", bin.SPDXID})
		for _, m := range info.Deps {
			if m.Replace != nil {
				m = m.Replace
			}
			id := spdxID("gomod", m.Path, m.Version)
			if _, ok := modules[id]; !ok {
				modules[id] = pkg{SPDXID: id, Name: m.Path, VersionInfo: m.Version, DownloadLocation: "https://proxy.golang.org/" + m.Path + "/@v/" + m.Version + ".zip",
					PrimaryPurpose: "LIBRARY", ExternalRefs: []externalRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + m.Path + "@" + m.Version}}}
			}
			doc.Relationships = append(doc.Relationships, relationship{bin.SPDXID, "CONTAINS", id})
		}
	}
	ids := make([]string, 0, len(modules))
	for id := range modules {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		doc.Packages = append(doc.Packages, modules[id])
	}
	return doc, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
