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
-- SET, 1–2 µs each), so one call takes as many keys as its caller has
-- (one TIME for them all, one MGET for their TATs, a SET per key that
-- allowed something), and the Lua is kept to arithmetic operators (a string
-- operand is converted in the VM, no tonumber call), one string.find and two
-- string.sub to read a TAT, one string.format to write it, and for one
-- request an integer reply (no table to build and decode). Why a count per
-- key rather than a key index per request: the requests of a key come
-- together, so a count is one argument per key, not one per request. The
-- stored format is the one earlier versions of this script wrote and read,
-- so during a rolling upgrade old and new scripts read each other's keys
-- exactly.
if redis.replicate_commands then
  pcall(redis.replicate_commands) -- Redis < 5: replicate effects, not the TIME-reading script
end
local t = redis.call('TIME')
local now_s = t[1] + 0
local now_ns = t[2] * 1000

if #KEYS == 1 then
  local ahead = 0 -- max(TAT - now, 0): a bucket never holds more than full
  local v = redis.call('GET', KEYS[1])
  if v then
    local sp = string.find(v, ' ', 1, true)
    if sp then
      local d = (string.sub(v, 1, sp - 1) - now_s) * 1000000000
        + (string.sub(v, sp + 1) - now_ns)
      if d > 0 then ahead = d end
    end
  end

  local debt, reply = ahead
  if #ARGV == 2 then
    local next = ahead + ARGV[1]
    if next <= ARGV[2] + 0 then
      debt, reply = next, next
    else
      reply = -ahead - 1
    end
  else
    reply = {}
    for i = 1, #ARGV, 2 do
      local next = debt + ARGV[i]
      if next <= ARGV[i + 1] + 0 then
        debt = next
        reply[#reply + 1] = next
      else
        reply[#reply + 1] = -debt - 1
      end
    end
  end

  if debt > ahead then -- something was allowed (cost·T ≥ 1)
    local total = now_ns + debt
    local carry = math.floor(total / 1000000000)
    redis.call('SET', KEYS[1],
      string.format('%d %d', now_s + carry, total - carry * 1000000000),
      'PX', math.ceil(debt / 1000000)) -- expire exactly when full: nothing is lost
  end
  return reply
end

-- Several keys: each as above, in a loop. Why not one function for both
-- paths: a local function is a closure made at every run, and a lone call
-- (one key, one request) is the latency path; it stays as it was. Why
-- MGET: one redis.call for every key's TAT. A key that holds another type
-- reads as no key here (GET would fail the script); keys under the store's
-- prefix are the store's own.
local vals = redis.call('MGET', unpack(KEYS))
local reply, i = {}, 1
for k = 1, #KEYS do
  local ahead = 0
  local v = vals[k]
  if v then
    local sp = string.find(v, ' ', 1, true)
    if sp then
      local d = (string.sub(v, 1, sp - 1) - now_s) * 1000000000
        + (string.sub(v, sp + 1) - now_ns)
      if d > 0 then ahead = d end
    end
  end
  local debt = ahead
  local last = i + 2 * ARGV[i] -- ARGV[i]: the key's request count; its pairs follow
  i = i + 1
  while i < last do
    local next = debt + ARGV[i]
    if next <= ARGV[i + 1] + 0 then
      debt = next
      reply[#reply + 1] = next
    else
      reply[#reply + 1] = -debt - 1
    end
    i = i + 2
  end
  if debt > ahead then
    local total = now_ns + debt
    local carry = math.floor(total / 1000000000)
    redis.call('SET', KEYS[k],
      string.format('%d %d', now_s + carry, total - carry * 1000000000),
      'PX', math.ceil(debt / 1000000))
  end
end
return reply
