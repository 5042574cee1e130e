"""Running rollouts: the agent started through its controller behind the gateway, graded, recorded."""
