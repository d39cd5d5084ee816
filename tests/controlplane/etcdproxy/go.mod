// The etcd fault proxy of the local control plane: a transparent gRPC proxy
// that can drop watch events, built against the etcd API of the pinned etcd.
module endpoints-guard.local/controlplane/etcdproxy

go 1.26.0

require (
	go.etcd.io/etcd/api/v3 v3.6.16
	google.golang.org/grpc v1.83.2
)

require (
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.29.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
