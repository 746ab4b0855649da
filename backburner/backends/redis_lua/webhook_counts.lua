-- ARGV: P. Pending, delivered and failed messages of the deployment, in one snapshot.
return {redis.call('ZCARD', WH_DUE), redis.call('ZCARD', WH_DELIVERED),
  redis.call('ZCARD', WH_FAILED)}
