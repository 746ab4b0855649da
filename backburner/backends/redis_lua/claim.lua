-- ARGV: P, worker_id, worker_id as JSON, now, lease_until, limit, type, type, ... (no types: any)
-- A claim ends the worker's idle registration: nothing is handed to it while it claims.
end_idle(ARGV[2])
return claim_for(ARGV[2], ARGV[3], ARGV[4], ARGV[5], types_from(7), tonumber(ARGV[6]))
