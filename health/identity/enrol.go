package identity

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Enrolment keeps a member's pinned keys from the API server in Kubernetes mode, and enrols the
// member's own key there (kube/enrol.go has the hub's side): it reads the ConfigMap the hub keeps every
// EnrolmentInterval, hands every change to the gossip and writes it to a local copy (read at the next
// start, when the API server may be down with etcd's quorum), and while its own key is not pinned for
// its node it asks for it with a CertificateSigningRequest. It talks to the API server with plain
// HTTPS and the pod's own service account token (the agent links no Kubernetes client).
type Enrolment struct {
	// Server is the API server's URL; CAFile its CA bundle; TokenFile the pod's service account token
	// (read at each request: the kubelet rotates it). Or Client, which authenticates by itself (the
	// hub's, from its Kubernetes client configuration).
	Server, CAFile, TokenFile string
	Client                    *http.Client
	// Namespace and ConfigMap name the pinned keys (data key PinnedKeysKey).
	Namespace, ConfigMap string
	// Node is this member's name, which its key is enrolled for; Identity its key.
	Node     string
	Identity Identity
	// Copy is the local copy of the pinned keys (the pinned-keys file's format).
	Copy string
	Log  *slog.Logger

	known Pinned // the pinned keys in force: the copy's (Start), then the ConfigMap's
}

// EnrolmentInterval is how often the pinned keys are read from the API server.
const EnrolmentInterval = 2 * time.Second

// enrolAgain is how long an enrolment request the API server took is given before it is made again.
const enrolAgain = time.Minute

// The names both sides of enrolment use (kube.Enroller, the hub's, and Enrolment): the signerName of
// the requests through which members enrol their identity keys, and the ConfigMap (in Hale's
// namespace) and its data key that hold the pinned keys, in the pinned-keys file's format.
const (
	IdentitySigner  = "hale.dev/identity"
	PinnedConfigMap = "hale-pinned-keys"
	PinnedKeysKey   = "pinned-keys"
)

// InClusterEnrolment is an Enrolment with the pod's own service account (its token, CA and namespace,
// where the kubelet mounts them) and the API server it is told of (KUBERNETES_SERVICE_HOST and _PORT).
func InClusterEnrolment(node, copyFile string, id Identity, log *slog.Logger) (*Enrolment, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount"
	ns, err := os.ReadFile(filepath.Join(sa, "namespace"))
	if host == "" || port == "" || err != nil {
		return nil, fmt.Errorf("gossip.enrol: kubernetes needs the agent in a pod with its service account token mounted (KUBERNETES_SERVICE_HOST %q, %s: %v): "+
			"set automountServiceAccountToken, or enrol by hand with gossip.pinnedFile (docs/identities.md)", host, sa, err)
	}
	return &Enrolment{Server: "https://" + net.JoinHostPort(host, port), CAFile: filepath.Join(sa, "ca.crt"), TokenFile: filepath.Join(sa, "token"),
		Namespace: strings.TrimSpace(string(ns)), ConfigMap: PinnedConfigMap, Node: node, Identity: id, Copy: copyFile, Log: log}, nil
}

// Start returns the pinned keys a member starts with: its local copy's (none yet on a first start:
// no key pinned), until Run has read the ConfigMap. A copy that cannot be read is said, and counts as none.
func (e *Enrolment) Start() *Pinned {
	raw, err := os.ReadFile(e.Copy)
	switch {
	case err == nil:
		e.known, err = ParsePinned(raw, e.Copy)
	case errors.Is(err, os.ErrNotExist):
		err = nil
	}
	if err != nil {
		e.known = Pinned{}
		e.Log.Warn("pinned keys: the local copy cannot be read; waiting for the API server's", "file", e.Copy, "err", err)
	}
	p := e.known
	return &p
}

// Run keeps the pinned keys until ctx ends, handing each change to set.
func (e *Enrolment) Run(ctx context.Context, set func(Pinned)) {
	var last string
	var asked time.Time
	var warned string
	warn := func(msg string, err error) {
		if err.Error() != warned {
			e.Log.Warn(msg, "err", err)
			warned = err.Error()
		}
	}
	t := time.NewTicker(EnrolmentInterval)
	defer t.Stop()
	for {
		text, err := e.read(ctx)
		var p Pinned
		if err == nil {
			p, err = ParsePinned([]byte(text), "ConfigMap "+e.Namespace+"/"+e.ConfigMap)
		}
		switch {
		case err != nil:
			warn("pinned keys: cannot read them from the API server; the last ones stay", err)
		case text != last:
			if err := writeCopy(e.Copy, text); err != nil { // (kept before it is used)
				warn("pinned keys: cannot keep the local copy", err)
			}
			set(p)
			e.Log.Info("pinned keys: read from the API server", "configMap", e.Namespace+"/"+e.ConfigMap, "entries", p.Len(), "thisNodePinned", e.pinned(p))
			last, warned, e.known = text, "", p
		}
		if !e.pinned(e.known) && time.Since(asked) > enrolAgain {
			// A request that did not reach the API server is made again at the next read, not a minute
			// later: a machine booting just after a quorum loss finds some API servers still listed in
			// the kubernetes Service that do not answer, and its agent is not heard until it is pinned.
			if name, err := e.request(ctx); err != nil {
				warn("enrolment: cannot ask the API server to pin this node's key", err)
			} else {
				e.Log.Info("enrolment: asked for this node's key to be pinned; the hub pins it for the node this pod runs on", "node", e.Node,
					"key", e.Identity.Public().String(), "csr", name)
				asked = time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pinned: this member's key is pinned for its node.
func (e *Enrolment) pinned(p Pinned) bool {
	return pinnedFor(p, e.Node, e.Identity.Public())
}

func pinnedFor(p Pinned, name string, k PublicKey) bool {
	for _, pk := range p.Keys(name) {
		if bytes.Equal(pk, k) {
			return true
		}
	}
	return false
}

// read returns the ConfigMap's pinned keys.
func (e *Enrolment) read(ctx context.Context) (string, error) {
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := e.do(ctx, http.MethodGet, "/api/v1/namespaces/"+e.Namespace+"/configmaps/"+e.ConfigMap, nil, &cm); err != nil {
		return "", err
	}
	return cm.Data[PinnedKeysKey], nil
}

// request asks for this member's key to be pinned for its node (a CertificateSigningRequest named
// after the key, so that asking again is the same request) and returns the request's name.
func (e *Enrolment) request(ctx context.Context) (string, error) {
	req, err := e.Identity.EnrolmentRequest(e.Node)
	if err != nil {
		return "", err
	}
	name := "hale-identity-" + e.Identity.Public().Fingerprint()
	body := map[string]any{"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
		"metadata": map[string]any{"name": name, "labels": map[string]string{"app.kubernetes.io/part-of": "hale"}},
		"spec":     map[string]any{"signerName": IdentitySigner, "request": req, "usages": []string{"digital signature"}}}
	err = e.do(ctx, http.MethodPost, "/apis/certificates.k8s.io/v1/certificatesigningrequests", body, nil)
	if errors.Is(err, errConflict) {
		return name, nil // asked already: the hub answers it
	}
	return name, err
}

var errConflict = errors.New("already exists")

// do makes one request to the API server with the service account's token.
func (e *Enrolment) do(ctx context.Context, method, path string, body, out any) error {
	c, token, err := e.client()
	if err != nil {
		return err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(e.Server, "/")+path, rd)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, e.Server+path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusConflict:
		return errConflict
	case resp.StatusCode/100 != 2:
		var st struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(raw, &st)
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, st.Message)
	case out != nil:
		return json.Unmarshal(raw, out)
	}
	return nil
}

// client is the HTTP client to the API server, and the token it must send (none: Client authenticates).
func (e *Enrolment) client() (*http.Client, string, error) {
	if e.Client != nil {
		return e.Client, "", nil
	}
	token, err := os.ReadFile(e.TokenFile)
	if err != nil {
		return nil, "", fmt.Errorf("the service account token: %w", err)
	}
	ca, err := os.ReadFile(e.CAFile)
	if err != nil {
		return nil, "", fmt.Errorf("the API server's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, "", fmt.Errorf("the API server's CA %s: no PEM certificate in it", e.CAFile)
	}
	// A new connection for each request: the agent asks every couple of seconds, and a connection kept
	// to an API server that froze would hold the next request to its timeout.
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, DisableKeepAlives: true}},
		strings.TrimSpace(string(token)), nil
}

// writeCopy replaces the local copy of the pinned keys (a temporary file renamed over it).
func writeCopy(path, text string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".new")
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
