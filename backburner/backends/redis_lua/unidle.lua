-- ARGV: P, worker_id. The worker stops waiting: nothing more is handed to it.
end_idle(ARGV[2])
return 1
