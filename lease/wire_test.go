package lease_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/lease"
)

// The JSON field names are the protocol of docs/leases.md.
func TestWireJSON(t *testing.T) {
	req := lease.Request{Holder: "h", Keys: []lease.KeyRequest{{Policy: "p", Key: "k", Token: "t", Seq: 3,
		HaveRate: 1.5, HaveBurst: 2, Want: 4, Waiting: true, Release: true}}}
	b, err := json.Marshal(req)
	require.NoError(t, err)
	assert.JSONEq(t, `{"holder":"h","keys":[{"policy":"p","key":"k","token":"t","seq":3,"have_rate":1.5,
		"have_burst":2,"want":4,"waiting":true,"release":true}]}`, string(b))
	resp := lease.Response{RefreshMS: 5000, Keys: []lease.Grant{{Policy: "p", Key: "k", Token: "t", Seq: 4,
		Rate: 2.5, Burst: 3, ExpiresMS: 20000, LimitRate: 10, LimitBurst: 10},
		{Policy: "p", Key: "x", Error: "unknown_policy", Message: "m"}}}
	b, err = json.Marshal(resp)
	require.NoError(t, err)
	assert.JSONEq(t, `{"refresh_ms":5000,"keys":[
		{"policy":"p","key":"k","token":"t","seq":4,"rate":2.5,"burst":3,"expires_ms":20000,"limit_rate":10,"limit_burst":10},
		{"policy":"p","key":"x","rate":0,"burst":0,"expires_ms":0,"limit_rate":0,"limit_burst":0,"error":"unknown_policy","message":"m"}]}`, string(b))
	var back lease.Response
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, resp, back)
	// A new key's request carries only what it has.
	b, err = json.Marshal(lease.KeyRequest{Policy: "p", Key: "k"})
	require.NoError(t, err)
	assert.JSONEq(t, `{"policy":"p","key":"k","want":0}`, string(b))
}
