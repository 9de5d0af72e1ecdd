package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// HTTP is a Transport that renews over HTTP: one POST of the Request as
// JSON to baseURL + "/lease" (`sluice serve`'s endpoint), and the Response
// decoded from JSON. hc nil means http.DefaultClient; bound each renewal
// with ctx or hc's Timeout. A status other than 200 is an error carrying
// the server's message; a refusal of the whole request (ErrBadRequest,
// ErrTooManyKeys) keeps its code, so errors.Is and Code see it.
func HTTP(baseURL string, hc *http.Client) Transport {
	if hc == nil {
		hc = http.DefaultClient
	}
	url := strings.TrimRight(baseURL, "/") + "/lease"
	return TransportFunc(func(ctx context.Context, req *Request) (*Response, error) {
		// Why no HTML escaping: json.Marshal writes '&', '<' and '>' as six
		// bytes each, so a full request of keys made of them (a URL's
		// query) passed the server's bound on a request's bytes, which
		// counts names as written.
		var body bytes.Buffer
		enc := json.NewEncoder(&body)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(req); err != nil {
			return nil, err
		}
		hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, &body)
		if err != nil {
			return nil, err
		}
		hr.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(hr)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, responseLimit(req)))
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			var e struct {
				Error string `json:"error"`
				Code  string `json:"code"`
			}
			if json.Unmarshal(b, &e) == nil && e.Code != "" {
				return nil, Err(e.Code, e.Error)
			}
			if e.Error == "" {
				e.Error = strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("lease: %s: %s: %s", url, resp.Status, e.Error)
		}
		var out Response
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, fmt.Errorf("lease: %s: %w", url, err)
		}
		if len(out.Keys) != len(req.Keys) {
			return nil, errors.New("lease: the server answered " + fmt.Sprint(len(out.Keys)) + " keys for " + fmt.Sprint(len(req.Keys)))
		}
		return &out, nil
	})
}

// responseLimit bounds what HTTP reads of the answer to req: one Grant per
// key, each echoing its policy and key. Why per byte of them: names may be
// up to 1024 bytes, and JSON writes a byte as up to six (\u003c for '<',
// \ufffd for invalid UTF-8), once in the field and, for the policy, again
// quoted in a refusal's message; a fixed figure per key cut the answer to
// long keys, and every renewal failed.
func responseLimit(req *Request) int64 {
	n := int64(4096)
	for i := range req.Keys {
		n += 2048 + 12*int64(len(req.Keys[i].Policy)+len(req.Keys[i].Key))
	}
	return n
}
