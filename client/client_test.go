package client_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/client"
)

// The tests that run the client against a real service are in the service's
// module (cmd/sluice/internal/clientcheck), which this module cannot require.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8100", "ftp://h:1", "http://", "http://%zz"} {
		_, err := client.New(u)
		assert.Error(t, err, "%q", u)
	}
	c, err := client.New("http://127.0.0.1:8100/")
	require.NoError(t, err)
	c.Close()
}
