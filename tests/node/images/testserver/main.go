// testserver is the workload of make e2e-node: GET / answers with the pod's
// name, so a client knows which endpoint served it; GET /healthz is the
// readiness probe, turned off and on by POST /unready and POST /ready (the
// test reaches a pod at its IP to make it unready through its probe).
//
// On SIGTERM it keeps serving for DRAIN_SECONDS (default 5) before it exits,
// as a well-behaved server does while its endpoint is withdrawn, so that a
// rolling update fails a request only when an endpoint is wrong.
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	drain := 5 * time.Second
	if v := os.Getenv("DRAIN_SECONDS"); v != "" {
		seconds, err := strconv.Atoi(v)
		if err != nil || seconds < 0 {
			log.Fatalf("DRAIN_SECONDS=%q: want a whole number of seconds", v)
		}
		drain = time.Duration(seconds) * time.Second
	}
	addr := os.Getenv("LISTEN")
	if addr == "" {
		addr = ":8080"
	}

	var ready atomic.Bool
	ready.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, name)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "unready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("POST /unready", func(w http.ResponseWriter, _ *http.Request) {
		ready.Store(false)
		fmt.Fprintln(w, "unready")
	})
	mux.HandleFunc("POST /ready", func(w http.ResponseWriter, _ *http.Request) {
		ready.Store(true)
		fmt.Fprintln(w, "ready")
	})
	server := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		log.Printf("terminating: serving %s more", drain)
		time.Sleep(drain)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	log.Printf("%s listening on %s", name, addr)
	if err := server.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
