-- GCRA for sluice: the same rule as store.Decide, on Redis's clock.
-- KEYS[1]  bucket key; its value is "SECONDS NANOS", the theoretical
--          arrival time (TAT) on Redis's TIME clock.
-- ARGV     T (emission interval, ns), tau (= burst*T, ns), cost (tokens)
-- Returns  {allowed (1/0), tau - (TAT' - now) in ns, reset_after ns, retry_after ns}
--
-- Lua numbers are doubles, exact only below 2^53. Absolute nanoseconds since
-- the epoch are not, so TAT is kept as whole seconds plus nanoseconds and all
-- arithmetic is on the difference TAT - now, which the service bounds by
-- tau < 2^52 ns.
if redis.replicate_commands then
  pcall(redis.replicate_commands) -- Redis < 5: replicate effects, not the TIME-reading script
end
local T = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_ns = tonumber(t[2]) * 1000

local ahead = 0 -- max(TAT - now, 0): a bucket never holds more than full
local v = redis.call('GET', KEYS[1])
if v then
  local sp = string.find(v, ' ', 1, true)
  if sp then
    local d = (tonumber(string.sub(v, 1, sp - 1)) - now_s) * 1000000000
      + (tonumber(string.sub(v, sp + 1)) - now_ns)
    if d > 0 then ahead = d end
  end
end

local next = ahead + cost * T
if next <= tau then
  local total = now_ns + next
  local carry = math.floor(total / 1000000000)
  redis.call('SET', KEYS[1],
    string.format('%d %d', now_s + carry, total - carry * 1000000000),
    'PX', math.ceil(next / 1000000)) -- expire exactly when full: nothing is lost
  return {1, tau - next, next, 0}
end
return {0, tau - ahead, ahead, next - tau}
