-- GCRA for sluice: the same rule as internal/gcra's Step, on Redis's clock.
-- KEYS     bucket keys, distinct; each value is "SECONDS NANOS", the theoretical
--          arrival time (TAT) on Redis's TIME clock.
-- ARGV     one key: per request cost·T (ns), tau (= burst·T, ns), with
--          1 ≤ cost·T ≤ tau, one pair after another.
--          several keys: per key in KEYS' order, its number of requests n,
--          then its n pairs.
-- Returns  per request one integer: allowed, TAT' − now (> 0, the bucket's
--          debt after it); denied, −(max(TAT − now, 0)) − 1 (< 0). One key
--          and one request: that integer; else an array of them, one per
--          request in ARGV's order.
--
-- A key's requests are decided one after another at one now, each against
-- the TAT the ones before it left, and the keys one after another at that
-- same now: what the same requests sent one per call would get from a Redis
-- that ran them all within the same microsecond.
--
-- Lua numbers are doubles, exact only below 2^53. Absolute nanoseconds since
-- the epoch are not, so TAT is kept as whole seconds plus nanoseconds and all
-- arithmetic is on the difference TAT − now, which the service bounds by
-- tau < 2^52 ns.
--
-- Why this shape: a call's cost inside Redis is mostly per call (parsing,
-- script lookup, the Lua call, the reply) and per redis.call() (TIME, GET,
-- SET), so one call takes as many keys as its caller has (one TIME for them
-- all, one MGET for their TATs, a SET per key that allowed something), and
-- the Lua is kept to arithmetic operators (a string operand is converted in
-- the VM, no tonumber call), one string.find and two string.sub to read a
-- TAT, one string.format to write it, and for one request an integer reply
-- (no array for the client to decode). One key and several share one loop;
-- what differs is how the TATs are read and where a key's pairs start. Why a
-- count per key rather than a key index per request: the requests of a key
-- come together, so a count is one argument per key, not one per request.
-- The stored format is the one earlier versions of this script wrote and
-- read, so during a rolling upgrade old and new scripts read each other's
-- keys exactly; gcra_all.lua reads and writes it too (a script cannot call
-- another's code, so it has its own copy; TestStoredFormatShared holds the
-- two together).
if redis.replicate_commands then
  pcall(redis.replicate_commands) -- Redis < 5: replicate effects, not the TIME-reading script
end
local t = redis.call('TIME')
local now_s = t[1] + 0
local now_ns = t[2] * 1000

-- One key: GET, and ARGV is its pairs alone. Several: one MGET for every
-- key's TAT (a key that holds another type reads as no key there, where
-- GET would fail the script; keys under the store's prefix are the
-- store's own), and ARGV a count before each key's pairs.
local one = #KEYS == 1
local vals
if not one then
  vals = redis.call('MGET', unpack(KEYS))
end
-- One key and one request: an integer reply, no table (the latency path).
local single = #ARGV == 2
local reply, i = 0, 1
if not single then
  reply = {}
end
for k = 1, #KEYS do
  local v
  if one then
    v = redis.call('GET', KEYS[1])
  else
    v = vals[k]
  end
  local ahead = 0 -- max(TAT - now, 0): a bucket never holds more than full
  if v then
    local sp = string.find(v, ' ', 1, true)
    if sp then
      local d = (string.sub(v, 1, sp - 1) - now_s) * 1000000000
        + (string.sub(v, sp + 1) - now_ns)
      if d > 0 then ahead = d end
    end
  end

  local debt, last = ahead
  if one then
    last = #ARGV + 1
  else
    last = i + 2 * ARGV[i] -- ARGV[i]: the key's request count; its pairs follow
    i = i + 1
  end
  while i < last do
    local next = debt + ARGV[i]
    local r = -debt - 1
    if next <= ARGV[i + 1] + 0 then
      debt, r = next, next
    end
    if single then
      reply = r
    else
      reply[#reply + 1] = r
    end
    i = i + 2
  end

  if debt > ahead then -- something was allowed (cost·T ≥ 1)
    local total = now_ns + debt
    local carry = math.floor(total / 1000000000)
    redis.call('SET', KEYS[k],
      string.format('%d %d', now_s + carry, total - carry * 1000000000),
      'PX', math.ceil(debt / 1000000)) -- expire exactly when full: nothing is lost
  end
end
return reply
