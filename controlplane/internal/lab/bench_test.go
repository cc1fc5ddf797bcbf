package lab

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// BenchmarkReplay replays a generated access log of -lines lines (default
// 100,000; 1,000 users, one request every 10 ms or so, a per-user token
// bucket and a per-user fixed window) and reports log lines per second and
// the peak of the Go heap during the run:
//
//	go test ./controlplane/internal/lab -run '^$' -bench Replay -benchtime 1x -lines 1000000
func BenchmarkReplay(b *testing.B) {
	bin := testModule(b)
	pol := mustPolicy(b, `{"policy":"bench","identity":{"user_header":"x-user-id"},"rules":[
 {"id":"per-user-bucket","match":{"path_prefix":"/api/"},"key":["user"],"algorithm":"token_bucket","limit":600,"window":"1m"},
 {"id":"per-user-minute","match":{"path_prefix":"/api/"},"key":["user"],"algorithm":"fixed_window","limit":1000,"window":"1m"}]}`)
	path := filepath.Join(b.TempDir(), "access.log")
	writeLog(b, path, genLog(1, *benchLines, 1000, DefaultStart, 5*time.Millisecond), time.Second, 2)
	b.ResetTimer()
	for range b.N {
		lr, err := ReadLog([]string{path}, DefaultFields("x-user-id", ""), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		var peak uint64
		var ms runtime.MemStats
		start := time.Now()
		rep, err := Replay(context.Background(), bin, pol, lr, ReplayOptions{Progress: func(int64) {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}})
		elapsed := time.Since(start)
		lr.Close()
		if err != nil {
			b.Fatal(err)
		}
		if rep.Requests != int64(*benchLines) {
			b.Fatalf("replayed %d of %d", rep.Requests, *benchLines)
		}
		b.ReportMetric(float64(rep.Requests)/elapsed.Seconds(), "lines/s")
		b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
	}
}
