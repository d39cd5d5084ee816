// Command etcd is the upstream etcd server, built from the pinned
// go.etcd.io/etcd/server/v3 module. The etcd repository keeps its main package
// in a module of its own; the server's entry point lives in etcdmain, so this
// file only hands over the command line.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
