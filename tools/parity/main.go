// Command tessera-parity answers, for a pod and a cluster, which nodes the real
// kube-scheduler would accept and why it rejects the others, by running the
// default profile of kube-scheduler's own framework (the k8s.io/kubernetes
// release pinned in tools/go.mod) in-process.
//
// It reads one JSON case per line on stdin and writes one JSON result per line
// on stdout, in the same order. See README.md in this folder for the protocol.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	jsoniter "github.com/json-iterator/go"
	"k8s.io/klog/v2"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

func main() {
	listPlugins := flag.Bool("list-plugins", false, "print the default profile's plugins per extension point (with score weights) as JSON and exit")
	workers := flag.Int("j", runtime.GOMAXPROCS(0), "cases evaluated in parallel, each by its own framework instance (output order is kept)")
	stats := flag.Bool("stats", false, "at end of input, print per-case timing (decode + evaluate + encode) and throughput to stderr")
	draMode := flag.Bool("dra", false, "DRA mode: decide ResourceClaim allocation on one node with the structured allocator (see dra.go)")
	flag.Parse()

	// A case allocates a few MB and keeps none of it, while the live heap is
	// small, so the default GOGC=100 collects every couple of cases; 400
	// measured about 25% faster per case. An explicit GOGC still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}

	// The framework and plugins log through klog; keep stdout for results and
	// stderr quiet.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)

	if *draMode {
		if err := serveDRA(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "tessera-parity:", err)
			os.Exit(1)
		}
		return
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "tessera-parity:", err)
		os.Exit(1)
	}
	harnesses := make([]*Harness, max(*workers, 1))
	for i := range harnesses {
		h, err := NewHarness(ctx)
		if err != nil {
			fail(err)
		}
		harnesses[i] = h
		if *listPlugins {
			if err := json.NewEncoder(os.Stdout).Encode(pluginSummary(h.Plugins())); err != nil {
				fail(err)
			}
			return
		}
	}
	var statsOut io.Writer
	if *stats {
		statsOut = os.Stderr
	}
	if err := serve(harnesses, os.Stdin, os.Stdout, statsOut); err != nil {
		fail(err)
	}
}

// serve answers every non-blank line of in on out, in input order. Each
// harness evaluates lines on its own goroutine (a Harness is not safe for
// concurrent use); results are put back in order before they are written.
// Only I/O errors end it early; a bad line gets a result with "error" set.
// If statsOut is not nil, timing is printed there at the end.
func serve(harnesses []*Harness, in io.Reader, out io.Writer, statsOut io.Writer) error {
	type job struct {
		seq  int
		line []byte
	}
	type answer struct {
		seq  int
		line []byte
		took time.Duration
	}
	jobs := make(chan job, 2*len(harnesses))
	answers := make(chan answer, 2*len(harnesses))
	var wg sync.WaitGroup
	for _, h := range harnesses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				start := time.Now()
				b := encodeResult(handleLine(h, j.line))
				answers <- answer{seq: j.seq, line: b, took: time.Since(start)}
			}
		}()
	}
	go func() { wg.Wait(); close(answers) }()

	// Reader: numbers the lines. read counts lines handed out, so the writer
	// knows when every line read so far has been answered.
	var read atomic.Int64
	var readErr error
	go func() {
		defer close(jobs)
		r := bufio.NewReaderSize(in, 1<<20)
		for seq := 0; ; {
			line, err := r.ReadBytes('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				read.Add(1)
				jobs <- job{seq: seq, line: line}
				seq++
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					readErr = err
				}
				return
			}
		}
	}()

	// Writer: emits answers in input order and flushes whenever it has caught
	// up with the reader, so a caller feeding one line at a time gets each
	// answer at once while bulk input is written in large chunks.
	begin := time.Now()
	w := bufio.NewWriterSize(out, 1<<20)
	pending := map[int]answer{}
	var took []time.Duration
	var writeErr error
	next := 0
	for a := range answers {
		pending[a.seq] = a
		for {
			a, ok := pending[next]
			if !ok {
				break
			}
			delete(pending, next)
			next++
			took = append(took, a.took)
			if writeErr == nil {
				_, writeErr = w.Write(a.line)
			}
		}
		if writeErr == nil && int64(next) == read.Load() {
			writeErr = w.Flush()
		}
	}
	if writeErr == nil {
		writeErr = w.Flush()
	}
	if statsOut != nil {
		printStats(statsOut, took, time.Since(begin), len(harnesses))
	}
	if writeErr != nil {
		return writeErr
	}
	return readErr
}

// encodeResult renders one output line, newline included.
func encodeResult(res *Result) []byte {
	b, err := json.Marshal(res)
	if err != nil {
		// Cannot happen with these types; answer the line anyway.
		b, _ = json.Marshal(&Result{ID: res.ID, Nodes: map[string]*NodeResult{}, Error: "encoding the result: " + err.Error()})
	}
	return append(b, '\n')
}

// caseJSON decodes input lines. It is json-iterator configured as
// k8s.io/apimachinery's JSON serializer was while it used json-iterator
// (case-sensitive field names, unknown fields ignored): for valid input it
// builds the same objects as the API server's current decoder,
// sigs.k8s.io/json (TestDecodersAgree checks this), at about half the cost,
// and decoding was most of the time of a case.
var caseJSON = jsoniter.Config{EscapeHTML: true, SortMapKeys: true, ValidateJsonRawMessage: true, CaseSensitive: true}.Froze()

// handleLine decodes and evaluates one line.
func handleLine(h *Harness, line []byte) *Result {
	var c Case
	if err := caseJSON.Unmarshal(line, &c); err != nil {
		return &Result{ID: salvageID(line), Nodes: map[string]*NodeResult{}, Error: "bad case: " + err.Error()}
	}
	return h.Evaluate(&c)
}

// salvageID recovers the "id" of a line that failed to decode as a Case, so
// the caller can still match the error to its case.
func salvageID(line []byte) json.RawMessage {
	var probe struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(line, &probe) == nil {
		return probe.ID
	}
	return nil
}

func printStats(w io.Writer, d []time.Duration, wall time.Duration, workers int) {
	if len(d) == 0 {
		fmt.Fprintln(w, "tessera-parity: 0 cases")
		return
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	var total time.Duration
	for _, x := range d {
		total += x
	}
	q := func(p float64) int64 { return sorted[int(p*float64(len(sorted)-1))].Microseconds() }
	fmt.Fprintf(w, "tessera-parity: %d cases; per case µs (decode+evaluate+encode, one worker): mean %d, p50 %d, p90 %d, p99 %d, max %d; "+
		"wall %d µs per case with %d workers\n",
		len(d), (total / time.Duration(len(d))).Microseconds(), q(0.5), q(0.9), q(0.99), sorted[len(sorted)-1].Microseconds(),
		(wall / time.Duration(len(d))).Microseconds(), workers)
}

// pluginSummary lists the enabled plugins of each extension point the
// harness runs, in the order the framework runs them.
func pluginSummary(p *schedulerapi.Plugins) map[string][]map[string]any {
	set := func(ps schedulerapi.PluginSet, weights bool) []map[string]any {
		out := []map[string]any{}
		for _, pl := range ps.Enabled {
			e := map[string]any{"name": pl.Name}
			if weights {
				e["weight"] = pl.Weight
			}
			out = append(out, e)
		}
		return out
	}
	return map[string][]map[string]any{
		"preEnqueue": set(p.PreEnqueue, false),
		"preFilter":  set(p.PreFilter, false),
		"filter":     set(p.Filter, false),
		"preScore":   set(p.PreScore, false),
		"score":      set(p.Score, true),
	}
}
