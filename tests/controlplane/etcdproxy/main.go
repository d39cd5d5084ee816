// Command etcd-fault-proxy sits between kube-apiserver and etcd and forwards
// every gRPC call unchanged (KV, Watch, Lease, Maintenance, Cluster, ...),
// except that, on command, it drops the events of chosen keys from Watch
// responses. That is how etcd bugs 18089 and 19179 look from kube-apiserver:
// its watch cache never learns of a DELETE, so every watch and every LIST it
// serves keeps the object, while a GET (served from etcd) finds it gone.
//
// Control API (plain HTTP on --control):
//
//	POST   /drop   {"key": "/registry/pods/ns/name", "prefix": false,
//	                "types": ["PUT", "DELETE"], "count": 0}
//	               drop matching events (count 0: until cleared); returns
//	               the rule with its id
//	DELETE /drop   forget every rule
//	POST   /hold   hold every Watch response from then on: kube-apiserver's
//	               watches of etcd stall (as on a member cut off from the
//	               others, etcd#17611) while its reads and writes go on
//	DELETE /hold   pass the held responses on, in order, and stop holding
//	GET    /stats  {"forwarded_events": n, "dropped_events": n, "held": bool, "rules": [...]}
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// frame is one gRPC message, passed through undecoded.
type frame struct{ payload []byte }

// rawCodec moves frames as bytes; named "proto" so peers see the usual
// content subtype.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return f.payload, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	f.payload = append(f.payload[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

const watchMethod = "/etcdserverpb.Watch/Watch"

// rule says which watch events to drop.
type rule struct {
	ID     int      `json:"id"`
	Key    string   `json:"key"`
	Prefix bool     `json:"prefix"`
	Types  []string `json:"types"`
	// Count is how many more events to drop; 0 means no limit.
	Count   int `json:"count"`
	Dropped int `json:"dropped"`
}

func (r *rule) matches(ev *mvccpb.Event) bool {
	key := string(ev.Kv.Key)
	if r.Prefix {
		if !bytes.HasPrefix(ev.Kv.Key, []byte(r.Key)) {
			return false
		}
	} else if key != r.Key {
		return false
	}
	if len(r.Types) == 0 {
		return true
	}
	for _, t := range r.Types {
		if t == ev.Type.String() {
			return true
		}
	}
	return false
}

type faults struct {
	mu    sync.Mutex
	rules []*rule
	// hold is open while Watch responses are held: closed on release.
	hold      chan struct{}
	nextID    int
	forwarded int
	dropped   int
}

// filter returns the Watch response to send, or nil to send nothing.
func (f *faults) filter(payload []byte) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.rules) == 0 {
		return payload, nil
	}
	var resp etcdserverpb.WatchResponse
	if err := resp.Unmarshal(payload); err != nil {
		return nil, fmt.Errorf("decoding a WatchResponse: %w", err)
	}
	if len(resp.Events) == 0 {
		return payload, nil
	}
	kept := resp.Events[:0]
	for _, ev := range resp.Events {
		if f.drop(ev) {
			f.dropped++
			log.Printf("dropped %s %s at revision %d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
			continue
		}
		f.forwarded++
		kept = append(kept, ev)
	}
	if len(kept) == 0 {
		// The message carried nothing else: it is lost as a whole, as a
		// watcher that missed the events would see it.
		return nil, nil
	}
	resp.Events = kept
	return resp.Marshal()
}

func (f *faults) drop(ev *mvccpb.Event) bool {
	for i, r := range f.rules {
		if !r.matches(ev) {
			continue
		}
		r.Dropped++
		if r.Count > 0 {
			r.Count--
			if r.Count == 0 {
				f.rules = append(f.rules[:i], f.rules[i+1:]...)
			}
		}
		return true
	}
	return false
}

// holding returns the channel to wait on while Watch responses are held,
// nil when they are not.
func (f *faults) holding() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hold
}

type proxy struct {
	upstream *grpc.ClientConn
	faults   *faults
}

// handle forwards one call of any method, as a bidirectional stream.
func (p *proxy) handle(_ any, down grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(down)
	if !ok {
		return errors.New("no method in the stream")
	}
	ctx, cancel := context.WithCancel(down.Context())
	defer cancel()
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = metadata.NewOutgoingContext(ctx, md.Copy())
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	up, err := p.upstream.NewStream(ctx, desc, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	// Requests: downstream → upstream.
	go func() {
		for {
			f := &frame{}
			if err := down.RecvMsg(f); err != nil {
				_ = up.CloseSend()
				return
			}
			if err := up.SendMsg(f); err != nil {
				return
			}
		}
	}()
	// Responses: upstream → downstream.
	if header, err := up.Header(); err == nil {
		_ = down.SendHeader(header)
	}
	for {
		f := &frame{}
		err := up.RecvMsg(f)
		if errors.Is(err, io.EOF) {
			down.SetTrailer(up.Trailer())
			return nil
		}
		if err != nil {
			down.SetTrailer(up.Trailer())
			return err
		}
		if method == watchMethod {
			if hold := p.faults.holding(); hold != nil {
				select {
				case <-hold:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			payload, err := p.faults.filter(f.payload)
			if err != nil {
				return err
			}
			if payload == nil {
				continue
			}
			f.payload = payload
		}
		if err := down.SendMsg(f); err != nil {
			return err
		}
	}
}

func (f *faults) serveControl(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.URL.Path == "/drop" && r.Method == http.MethodPost:
		var rl rule
		if err := json.NewDecoder(r.Body).Decode(&rl); err != nil || rl.Key == "" {
			http.Error(w, `{"error":"want {\"key\": ..., \"prefix\": bool, \"types\": [...], \"count\": n}"}`, http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.nextID++
		rl.ID = f.nextID
		rl.Dropped = 0
		f.rules = append(f.rules, &rl)
		f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(rl)
	case r.URL.Path == "/drop" && r.Method == http.MethodDelete:
		f.mu.Lock()
		f.rules = nil
		f.mu.Unlock()
		_, _ = w.Write([]byte("{}\n"))
	case r.URL.Path == "/hold" && r.Method == http.MethodPost:
		f.mu.Lock()
		if f.hold == nil {
			f.hold = make(chan struct{})
		}
		f.mu.Unlock()
		_, _ = w.Write([]byte("{}\n"))
	case r.URL.Path == "/hold" && r.Method == http.MethodDelete:
		f.mu.Lock()
		if f.hold != nil {
			close(f.hold)
			f.hold = nil
		}
		f.mu.Unlock()
		_, _ = w.Write([]byte("{}\n"))
	case r.URL.Path == "/stats" && r.Method == http.MethodGet:
		f.mu.Lock()
		stats := map[string]any{
			"forwarded_events": f.forwarded,
			"dropped_events":   f.dropped,
			"held":             f.hold != nil,
			"rules":            f.rules,
		}
		_ = json.NewEncoder(w).Encode(stats)
		f.mu.Unlock()
	default:
		http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address kube-apiserver connects to (--etcd-servers=http://ADDR)")
	upstream := flag.String("upstream", "", "etcd's client address, host:port")
	control := flag.String("control", "127.0.0.1:0", "address of the control API")
	flag.Parse()
	if *upstream == "" {
		log.Fatal("--upstream is required")
	}
	conn, err := grpc.NewClient(*upstream,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
	)
	if err != nil {
		log.Fatalf("connecting to %s: %v", *upstream, err)
	}
	p := &proxy{upstream: conn, faults: &faults{}}
	server := grpc.NewServer(
		grpc.ForceServerCodec(rawCodec{}),
		grpc.UnknownServiceHandler(p.handle),
		grpc.MaxRecvMsgSize(64<<20),
	)
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listening on %s: %v", *listen, err)
	}
	ctl, err := net.Listen("tcp", *control)
	if err != nil {
		log.Fatalf("listening on %s: %v", *control, err)
	}
	// The harness reads the bound addresses from these two lines.
	fmt.Printf("listening %s\ncontrol %s\n", lis.Addr(), ctl.Addr())
	go func() {
		log.Fatal(http.Serve(ctl, http.HandlerFunc(p.faults.serveControl)))
	}()
	log.Fatal(server.Serve(lis))
}
