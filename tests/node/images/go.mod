// The programs of the images make e2e-node builds and imports into containerd
// (no image can be pulled): the pod sandbox's pause and a small HTTP server.
// Standard library only.
module endpoints-guard.local/node/images

go 1.26.0
