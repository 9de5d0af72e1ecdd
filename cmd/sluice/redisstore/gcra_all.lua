-- All or nothing, for sluice's DecideAll: the rule of gcra.lua over several
-- requests at one reading of Redis's clock, spending only when all pass.
-- KEYS     one bucket key per request, in order; a key may repeat (its later
--          requests count the earlier ones).
-- ARGV     ARGV[1]: "1" to spend when every request passes, "0" to only
--          look; then per request its cost·T (ns) and tau (ns).
-- Returns  {spent, v1, v2, ...}: spent is 1 when every request passed and
--          all were written, else 0 and nothing was; vi is as gcra.lua's
--          reply: allowed, TAT' − now (> 0); denied, −(debt) − 1 (< 0).
-- The TAT is stored as gcra.lua stores it ("SECONDS NANOS"), read and
-- written here with a copy of its code: a script cannot call another's.
-- TestStoredFormatShared holds the two copies together.
if redis.replicate_commands then
  pcall(redis.replicate_commands)
end
local t = redis.call('TIME')
local now_s = t[1] + 0
local now_ns = t[2] * 1000
local vals = redis.call('MGET', unpack(KEYS))
local ahead, debt, reply, all = {}, {}, {0}, true
for k = 1, #KEYS do
  local name = KEYS[k]
  local d = debt[name]
  if d == nil then
    d = 0
    local v = vals[k]
    if v then
      local sp = string.find(v, ' ', 1, true)
      if sp then
        local x = (string.sub(v, 1, sp - 1) - now_s) * 1000000000
          + (string.sub(v, sp + 1) - now_ns)
        if x > 0 then d = x end
      end
    end
    ahead[name] = d
  end
  local next = d + ARGV[2 * k]
  if next <= ARGV[2 * k + 1] + 0 then
    debt[name] = next
    reply[k + 1] = next
  else
    debt[name] = d
    all = false
    reply[k + 1] = -d - 1
  end
end
if all and ARGV[1] == '1' then
  for name, d in pairs(debt) do
    if d > ahead[name] then
      local total = now_ns + d
      local carry = math.floor(total / 1000000000)
      redis.call('SET', name,
        string.format('%d %d', now_s + carry, total - carry * 1000000000),
        'PX', math.ceil(d / 1000000))
    end
  end
  reply[1] = 1
end
return reply
