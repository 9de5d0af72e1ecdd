-- GCRA for sluice: the same rule as store.Decide, on Redis's clock.
-- KEYS[1]  bucket key; its value is "SECONDS NANOS", the theoretical
--          arrival time (TAT) on Redis's TIME clock.
-- ARGV     cost·T (ns), tau (= burst·T, ns); 1 ≤ cost·T ≤ tau
-- Returns  one integer: allowed, TAT' − now (> 0, the bucket's debt after
--          the request); denied, −(max(TAT − now, 0)) − 1 (< 0).
--
-- Lua numbers are doubles, exact only below 2^53. Absolute nanoseconds since
-- the epoch are not, so TAT is kept as whole seconds plus nanoseconds and all
-- arithmetic is on the difference TAT − now, which the service bounds by
-- tau < 2^52 ns.
--
-- Why this shape: a call's cost inside Redis is mostly its redis.call()s
-- (TIME, GET, SET, about 1 µs each) plus the Lua around them, so the Lua is
-- kept to arithmetic operators (a string operand is converted in the VM, no
-- tonumber call), one string.find and two string.sub to read a TAT, one
-- string.format to write it, two arguments and an integer reply (no table
-- to build and decode). The stored format is the one earlier versions of this script
-- wrote and read, so during a rolling upgrade old and new scripts read each
-- other's keys exactly.
if redis.replicate_commands then
  pcall(redis.replicate_commands) -- Redis < 5: replicate effects, not the TIME-reading script
end
local inc = ARGV[1] + 0
local tau = ARGV[2] + 0
local t = redis.call('TIME')
local now_s = t[1] + 0
local now_ns = t[2] * 1000

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

local next = ahead + inc
if next <= tau then
  local total = now_ns + next
  local carry = math.floor(total / 1000000000)
  redis.call('SET', KEYS[1],
    string.format('%d %d', now_s + carry, total - carry * 1000000000),
    'PX', math.ceil(next / 1000000)) -- expire exactly when full: nothing is lost
  return next
end
return -ahead - 1
