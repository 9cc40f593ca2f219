package hub

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/hub/pass"
)

// The operator API: JSON over HTTP, served on a Unix socket (access by file permissions) or on
// localhost TCP with a bearer token. `hub status`, `hub reboot` and the other operator commands are
// its clients.
//
//	GET  /v1/status                       operator.Status
//	GET  /v1/machines/{name}/explain      text; operator.Explanation with Accept: application/json
//	POST /v1/machines/{name}/reboot       operator.RebootRequest (machine from the path) → operator.RebootResult
//	POST /v1/machines/{name}/detach       operator.BrakeRequest (optional) → operator.Status
//	POST /v1/machines/{name}/attach       operator.BrakeRequest (optional) → operator.Status
//	POST /v1/pause, /v1/resume            operator.BrakeRequest (optional) → operator.Status (pause: poll status until Pause is operator.Paused)
//	POST /v1/suspend, /v1/unsuspend       operator.BrakeRequest (optional) → operator.Status
//
// Errors are {"error": "..."} with 400 (bad request), 401 (token), 404 (no such machine) or 409
// (refused: unsafe or not allowed now).

// APIHandler returns the operator API; a non-empty token is required as "Authorization: Bearer".
func (h *Hub) APIHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, h.Status(r.Context())) })
	// An operator command's --cluster names a management-mode hub's cell (cmd/hub): this is not one.
	mux.HandleFunc("/clusters/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusBadRequest, operator.APIError{Error: "this hub heals one cluster (it does not run in a management cluster): drop --cluster"})
	})
	mux.HandleFunc("POST /v1/bmc-check", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, h.CheckBMCsNow(r.Context()))
	})
	mux.HandleFunc("GET /v1/recovery", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, h.RecoveryPlan(r.Context())) })
	mux.HandleFunc("POST /v1/recovery", func(w http.ResponseWriter, r *http.Request) {
		var req operator.RecoverRequest
		err := decodeBody(w, r, &req, false)
		if err == nil {
			err = checkText("by", req.By, maxBy)
			for _, c := range req.ConfirmLost {
				err = errors.Join(err, checkText("confirmLost", c, maxBy))
			}
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, operator.APIError{Error: fmt.Sprintf("recover request body: %v", err)})
			return
		}
		p, err := h.Recover(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, p)
	})
	mux.HandleFunc("GET /v1/remediations/{id...}", func(w http.ResponseWriter, r *http.Request) {
		rem, err := h.cfg.Journal.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, rem)
	})
	mux.HandleFunc("GET /v1/machines/{name}/explain", func(w http.ResponseWriter, r *http.Request) {
		e, err := h.Explain(r.Context(), r.PathValue("name"))
		if err != nil {
			writeError(w, err)
			return
		}
		if strings.Contains(r.Header.Get("Accept"), "application/json") {
			writeJSON(w, http.StatusOK, e)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(e.String()))
	})
	mux.HandleFunc("POST /v1/machines/{name}/reboot", func(w http.ResponseWriter, r *http.Request) {
		var req operator.RebootRequest
		err := decodeBody(w, r, &req, false)
		if err == nil {
			err = checkText("by", req.By, maxBy)
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, operator.APIError{Error: fmt.Sprintf("reboot request body: %v", err)})
			return
		}
		if req.Machine != "" && req.Machine != r.PathValue("name") {
			writeJSON(w, http.StatusBadRequest, operator.APIError{Error: fmt.Sprintf("body names machine %q, path %q", req.Machine, r.PathValue("name"))})
			return
		}
		req.Machine = r.PathValue("name")
		res, err := h.Reboot(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	for verb, detached := range map[string]bool{"detach": true, "attach": false} {
		mux.HandleFunc("POST /v1/machines/{name}/"+verb, func(w http.ResponseWriter, r *http.Request) {
			req, ok := brakeRequest(w, r)
			if !ok {
				return
			}
			if err := h.SetDetached(r.Context(), r.PathValue("name"), detached, req.By, req.Reason); err != nil {
				writeError(w, err)
				return
			}
			if detached {
				h.settled(r.Context(), r.PathValue("name"))
			}
			writeJSON(w, http.StatusOK, h.Status(r.Context()))
		})
	}
	for verb, set := range map[string]func(ctx context.Context, req operator.BrakeRequest) error{
		"pause": func(ctx context.Context, req operator.BrakeRequest) error {
			return h.SetPaused(ctx, true, req.By, req.Reason)
		},
		"resume": func(ctx context.Context, req operator.BrakeRequest) error {
			return h.SetPaused(ctx, false, req.By, req.Reason)
		},
		"suspend": func(ctx context.Context, req operator.BrakeRequest) error {
			if err := h.SetSuspended(ctx, true, req.By, req.Reason); err != nil {
				return err
			}
			h.settled(ctx, "")
			return nil
		},
		"unsuspend": func(ctx context.Context, req operator.BrakeRequest) error {
			return h.SetSuspended(ctx, false, req.By, req.Reason)
		},
	} {
		mux.HandleFunc("POST /v1/"+verb, func(w http.ResponseWriter, r *http.Request) {
			req, ok := brakeRequest(w, r)
			if !ok {
				return
			}
			if err := set(r.Context(), req); err != nil {
				writeError(w, err)
				return
			}
			writeJSON(w, http.StatusOK, h.Status(r.Context()))
		})
	}
	return RequireToken(token, mux)
}

// RequireToken serves next only to requests with "Authorization: Bearer token" (all, when token is
// empty: the socket, whose file mode is the access control).
func RequireToken(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeJSON(w, http.StatusUnauthorized, operator.APIError{Error: "missing or wrong token: pass the hub's API token file with --token-file"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// WriteAPIError answers an operator API request with status and the error message.
func WriteAPIError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, operator.APIError{Error: msg})
}

func brakeRequest(w http.ResponseWriter, r *http.Request) (operator.BrakeRequest, bool) {
	var req operator.BrakeRequest
	err := decodeBody(w, r, &req, true)
	if err == nil {
		err = errors.Join(checkText("by", req.By, maxBy), checkText("reason", req.Reason, maxReason))
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, operator.APIError{Error: fmt.Sprintf("request body: %v (want {\"by\": …, \"reason\": …} or nothing)", err)})
		return req, false
	}
	if req.By == "" {
		req.By = pass.Operator
	}
	return req, true
}

// Bounds of the free text a request carries into status, the journal, logs and Events.
const (
	maxBy     = 256
	maxReason = 1024
	maxBody   = 16 << 10
)

// decodeBody reads exactly one JSON object of known fields into v (or nothing, when empty is
// allowed): a second value after it is an error, not ignored.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, empty bool) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) && empty {
			return nil
		}
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more after the JSON object: send one object")
	}
	return nil
}

// checkText refuses free text that is too long or holds control characters (a newline in a reason
// would forge lines in the text views and logs that show it).
func checkText(field, s string, limit int) error {
	switch {
	case len(s) > limit:
		return fmt.Errorf("%s: %d bytes, at most %d", field, len(s), limit)
	case strings.ContainsFunc(s, unicode.IsControl) || !utf8.ValidString(s):
		return fmt.Errorf("%s: control characters or invalid UTF-8", field)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, journal.ErrNoRemediation):
		code = http.StatusNotFound
	case errors.Is(err, ErrRefused):
		code = http.StatusConflict
	}
	writeJSON(w, code, operator.APIError{Error: strings.TrimSpace(err.Error())})
}
