// The etcd peer proxy of the local control plane: it carries the raft
// traffic between etcd members and can cut a member off from the others.
// Standard library only.
module endpoints-guard.local/controlplane/peerproxy

go 1.26.0
