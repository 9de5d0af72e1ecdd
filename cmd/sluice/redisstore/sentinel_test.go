package redisstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
)

func TestParseSentinelURL(t *testing.T) {
	o, err := redisstore.ParseSentinelURL("redis-sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2:26379/mymaster/3?sentinel_password=sp")
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.1:26379", "10.0.0.2:26379"}, o.SentinelAddrs)
	assert.Equal(t, "mymaster", o.MasterName)
	assert.Equal(t, 3, o.DB)
	assert.Equal(t, "app", o.Username)
	assert.Equal(t, "s3cret", o.Password)
	assert.Equal(t, "sp", o.SentinelPassword)
	assert.Nil(t, o.TLSConfig)

	o, err = redisstore.ParseSentinelURL("redis-sentinels://h:1/m")
	require.NoError(t, err)
	assert.Equal(t, 0, o.DB)
	require.NotNil(t, o.TLSConfig)
	assert.Equal(t, "h", o.TLSConfig.ServerName)

	for url, want := range map[string]string{
		"redis-sentinel://h:1":                  "no master name",
		"redis-sentinel://h:1/":                 "no master name",
		"redis-sentinel://h/m":                  `sentinel address "h" is not HOST:PORT`,
		"redis-sentinel://h:1,/m":               `sentinel address "" is not HOST:PORT`,
		"redis-sentinel://[::1]:1,h:2/m/x":      `database "x"`,
		"redis-sentinel://u:top@secret@h:1/m/x": "u:xxxxx@h:1",
		"redis-sentinel://h:1/m/x":              `database "x" is not a number`,
		"redis-sentinel://h:1/m/0/9":            `path "/m/0/9": want /MASTER or /MASTER/DB`,
		"redis-sentinel://h:1/m?db=2":           `unknown parameter "db"`,
		"redis://h:1/m":                         `scheme "redis"`,
		"redis-sentinel://u:topsecret@h:1/m/x":  "u:xxxxx@h:1",
	} {
		_, err := redisstore.ParseSentinelURL(url)
		require.Error(t, err, url)
		assert.Contains(t, err.Error(), want, url)
		assert.NotContains(t, err.Error(), "topsecret", "a password never shows in an error")
	}
}
