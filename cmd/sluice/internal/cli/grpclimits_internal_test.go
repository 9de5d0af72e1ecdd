package cli

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The -grpc-* flags reach GRPCLimits; values that leave no request room
// are refused with the flag's name.
func TestServeGRPCLimitFlags(t *testing.T) {
	parse := func(args ...string) (GRPCLimits, error) {
		var o ServeOptions
		fs := serveFlags(&o, io.Discard)
		if err := fs.Parse(args); err != nil {
			return GRPCLimits{}, err
		}
		_, err := o.config()
		return o.GRPCLimits, err
	}
	l, err := parse()
	require.NoError(t, err)
	assert.Equal(t, GRPCLimits{MaxRequestBytes: DefaultGRPCMaxRequestBytes, InFlightBytes: DefaultGRPCInFlightBytes, Transport: "sluice"}, l)
	l, err = parse("-grpc-max-streams", "8", "-grpc-max-request", "1024", "-grpc-in-flight", "4096")
	require.NoError(t, err)
	assert.Equal(t, GRPCLimits{MaxStreams: 8, MaxRequestBytes: 1024, InFlightBytes: 4096, Transport: "sluice"}, l)
	for args, want := range map[[2]string]string{
		{"-grpc-max-streams", "0"}:    `want a number of streams`,
		{"-grpc-max-request", "0"}:    `-grpc-max-request 0: must be positive`,
		{"-grpc-in-flight", "1000"}:   `-grpc-in-flight 1000: must be at least -grpc-max-request (65536)`,
		{"-grpc-max-request", "-1"}:   `-grpc-max-request -1: must be positive`,
		{"-grpc-max-streams", "1e10"}: `want a number of streams`,
		{"-grpc-transport", "h2"}:     `-grpc-transport "h2": want sluice or grpc-go`,
		// 64 MiB of 1-byte requests: 67,108,864 places, each a slot the
		// budget allocated up front (512 MiB) and swept in turn.
		{"-grpc-max-request", "1"}: `-grpc-in-flight 67108864 admits 67108864 requests of -grpc-max-request 1 at once, over the 1048576 maximum`,
	} {
		_, err := parse(args[0], args[1])
		require.Error(t, err, "%v", args)
		assert.Contains(t, err.Error(), want)
	}
}

// GRPCLimits fills its defaults and names a bad value.
func TestGRPCLimitsDefaults(t *testing.T) {
	l, err := GRPCLimits{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, GRPCLimits{MaxStreams: DefaultGRPCMaxStreams, RecvTimeout: DefaultGRPCRecvTimeout,
		MaxRequestBytes: DefaultGRPCMaxRequestBytes, InFlightBytes: DefaultGRPCInFlightBytes, IdleTimeout: DefaultGRPCIdleTimeout}, l)
	for _, c := range []struct {
		l    GRPCLimits
		want string
	}{
		{GRPCLimits{RecvTimeout: -time.Second}, "receive timeout -1s"},
		{GRPCLimits{MaxRequestBytes: -1}, "max request size -1"},
		{GRPCLimits{InFlightBytes: -1}, "in-flight bytes -1"},
		{GRPCLimits{IdleTimeout: -time.Second}, "idle timeout -1s"},
		{GRPCLimits{MaxRequestBytes: 100, InFlightBytes: 99}, "in-flight bytes 99: below the max request size 100"},
		{GRPCLimits{MaxRequestBytes: 1, InFlightBytes: 1 << 40}, "in-flight bytes 1099511627776 admit 1099511627776 requests of 1 bytes at once, over the 1048576 maximum"},
	} {
		_, err := c.l.withDefaults()
		require.Error(t, err, "%+v", c.l)
		assert.Contains(t, err.Error(), c.want)
	}
}

// A full budget takes back the places of ended streams, and refuses while
// every place is held by a stream still open.
func TestStreamBudget(t *testing.T) {
	b := newStreamBudget(2)
	one, two, three := make(chan struct{}), make(chan struct{}), make(chan struct{})
	require.True(t, b.admit(one))
	require.True(t, b.admit(two))
	require.False(t, b.admit(three), "full")
	close(one)
	b.noSweepUntil = time.Time{} // the refusal above swept and found nothing
	require.True(t, b.admit(three), "one's place, taken back")
	require.False(t, b.admit(make(chan struct{})))
	assert.Len(t, b.held, 2)
}
