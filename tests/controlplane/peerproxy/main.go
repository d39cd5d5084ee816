// Command etcd-peer-proxy carries the peer (raft) traffic of an etcd cluster
// on loopback, one route per member: each member advertises the route's
// listen address as its peer URL, and the route forwards to the address the
// member really listens on. On command it partitions a member from the
// others: its clients still reach it, its peers do not. That is a network
// partition as kube-apiserver sees it (kubernetes#89488, etcd#17611): the
// member it talks to is alive and answers, but has no leader and learns of
// no write.
//
// etcd's peer requests name their sender in the header X-Server-From (a
// member id in hex); the route a request arrives on names its receiver. A
// request is cut when exactly one of the two is isolated. Requests without a
// sender (version and health probes) pass, except to an isolated member.
//
// Control API (plain HTTP on --control):
//
//	POST   /isolate {"route": 0, "member_id": "<decimal id>"}
//	               cut member member_id, served by route (the index of its
//	               --route flag), off from the others; its open streams to
//	               and from them are closed
//	DELETE /isolate
//	               heal every partition
//	GET    /stats  {"forwarded": n, "cut": n, "isolated": [...]}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
)

// routes is the repeated --route flag: LISTEN=UPSTREAM.
type routes []string

func (r *routes) String() string     { return strings.Join(*r, ",") }
func (r *routes) Set(v string) error { *r = append(*r, v); return nil }

// isolation is which members are cut off, by route index and by member id
// (hex, as etcd writes it in X-Server-From).
type isolation struct {
	mu        sync.Mutex
	routes    map[int]bool
	ids       map[string]bool
	live      map[int]*liveRequest
	nextLive  int
	forwarded int
	cut       int
}

type liveRequest struct {
	route  int
	from   string
	cancel context.CancelFunc
}

// cuts says whether a request from member `from` (hex; "" when unnamed)
// to the member behind `route` crosses a partition.
func (s *isolation) cuts(route int, from string) bool {
	if s.routes[route] {
		return true
	}
	return from != "" && s.ids[from]
}

// admit registers a request, or says it is cut.
func (s *isolation) admit(route int, from string, cancel context.CancelFunc) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cuts(route, from) {
		s.cut++
		return 0, false
	}
	s.forwarded++
	s.nextLive++
	s.live[s.nextLive] = &liveRequest{route: route, from: from, cancel: cancel}
	return s.nextLive, true
}

func (s *isolation) done(id int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.live, id)
}

// isolate cuts member `id` (hex) behind `route` off and closes its open
// streams.
func (s *isolation) isolate(route int, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes[route] = true
	s.ids[id] = true
	for key, req := range s.live {
		if s.cuts(req.route, req.from) {
			req.cancel()
			delete(s.live, key)
			s.cut++
		}
	}
}

func (s *isolation) heal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes = map[int]bool{}
	s.ids = map[string]bool{}
}

func (s *isolation) route(index int, upstream string) (http.Handler, error) {
	target, err := url.Parse("http://" + upstream)
	if err != nil {
		return nil, fmt.Errorf("route %d: upstream %q: %w", index, upstream, err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// Raft streams are long-lived responses: pass every byte on at once.
	proxy.FlushInterval = -1
	proxy.ErrorLog = log.New(log.Writer(), fmt.Sprintf("route %d: ", index), log.LstdFlags)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		live, ok := s.admit(index, r.Header.Get("X-Server-From"), cancel)
		if !ok {
			http.Error(w, "partitioned", http.StatusServiceUnavailable)
			return
		}
		defer s.done(live)
		proxy.ServeHTTP(w, r.WithContext(ctx))
	}), nil
}

type isolateRequest struct {
	Route    *int   `json:"route"`
	MemberID string `json:"member_id"`
}

func (s *isolation) serveControl(routeCount int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/isolate" && r.Method == http.MethodPost:
			var req isolateRequest
			err := json.NewDecoder(r.Body).Decode(&req)
			var id uint64
			if err == nil {
				id, err = strconv.ParseUint(req.MemberID, 10, 64)
			}
			if err != nil || req.Route == nil || *req.Route < 0 || *req.Route >= routeCount {
				http.Error(w, `{"error":"want {\"route\": <index of a --route>, \"member_id\": \"<decimal id>\"}"}`, http.StatusBadRequest)
				return
			}
			s.isolate(*req.Route, strconv.FormatUint(id, 16))
			_, _ = w.Write([]byte("{}\n"))
		case r.URL.Path == "/isolate" && r.Method == http.MethodDelete:
			s.heal()
			_, _ = w.Write([]byte("{}\n"))
		case r.URL.Path == "/stats" && r.Method == http.MethodGet:
			s.mu.Lock()
			isolated := []int{}
			for route := range s.routes {
				isolated = append(isolated, route)
			}
			stats := map[string]any{"forwarded": s.forwarded, "cut": s.cut, "isolated": isolated}
			s.mu.Unlock()
			_ = json.NewEncoder(w).Encode(stats)
		default:
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
		}
	}
}

func main() {
	var rs routes
	flag.Var(&rs, "route", "LISTEN=UPSTREAM: the peer URL a member advertises and the address it listens on (repeated, one per member)")
	control := flag.String("control", "127.0.0.1:0", "address of the control API")
	flag.Parse()
	if len(rs) == 0 {
		log.Fatal("at least one --route is required")
	}
	s := &isolation{routes: map[int]bool{}, ids: map[string]bool{}, live: map[int]*liveRequest{}}
	for index, spec := range rs {
		listen, upstream, ok := strings.Cut(spec, "=")
		if !ok {
			log.Fatalf("--route %q: want LISTEN=UPSTREAM", spec)
		}
		handler, err := s.route(index, upstream)
		if err != nil {
			log.Fatal(err)
		}
		lis, err := net.Listen("tcp", listen)
		if err != nil {
			log.Fatalf("route %d: listening on %s: %v", index, listen, err)
		}
		go func() { log.Fatal(http.Serve(lis, handler)) }()
	}
	ctl, err := net.Listen("tcp", *control)
	if err != nil {
		log.Fatalf("listening on %s: %v", *control, err)
	}
	fmt.Printf("control %s\n", ctl.Addr())
	log.Fatal(http.Serve(ctl, s.serveControl(len(rs))))
}
