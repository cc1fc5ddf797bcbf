// Command sluice-echo is the demo upstream of `make run`: it answers every
// request with 200 and a JSON echo of it (method, path, query, headers,
// body), after waiting the number of milliseconds in the query parameter
// delay (at most 60000), so concurrency limits can be tried by hand:
//
//	curl 'http://127.0.0.1:8000/anything?delay=2000'
//
// It stops cleanly on SIGINT or SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8000", "listen address host:port")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: *listen, Handler: http.HandlerFunc(echo), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Fprintf(os.Stderr, "sluice-echo: listening on http://%s\n", *listen)
	select {
	case err := <-errc:
		fmt.Fprintf(os.Stderr, "sluice-echo: %v\n", err)
		os.Exit(1)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
}

// Echo is the JSON answer.
type Echo struct {
	Method  string              `json:"method"`
	Path    string              `json:"path"`
	Query   string              `json:"query"`
	Host    string              `json:"host"`
	Headers map[string][]string `json:"headers"`
	Body    string              `json:"body"`
	DelayMS int                 `json:"delay_ms"`
}

func echo(w http.ResponseWriter, r *http.Request) {
	delay, _ := strconv.Atoi(r.URL.Query().Get("delay"))
	delay = max(0, min(delay, 60000))
	if delay > 0 {
		select {
		case <-time.After(time.Duration(delay) * time.Millisecond):
		case <-r.Context().Done():
			return
		}
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(Echo{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Host: r.Host,
		Headers: r.Header, Body: string(body), DelayMS: delay})
}
