"""The inference router: deployments of model replicas on chips, routing, token streaming."""
