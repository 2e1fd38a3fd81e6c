package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// One node, one shared card with a stepped memory policy and one whole card:
// a claim for 1500k of memory gets 2Mi (rounded up to the step), a second
// claim asking more than the range allows gets nothing, and a class that
// does not exist is refused with the PreFilter's text.
const draSlice = `{"metadata":{"name":"s"},"spec":{"driver":"gpu.tessera.io","nodeName":"n",
 "pool":{"name":"n","generation":1,"resourceSliceCount":1},
 "devices":[{"name":"g0","allowMultipleAllocations":true,
   "capacity":{"memory":{"value":"80Gi","requestPolicy":{"default":"80Gi",
     "validRange":{"min":"1Mi","max":"80Gi","step":"1Mi"}}}}}]}}`

const draClass = `{"metadata":{"name":"gpu"},"spec":{"selectors":[{"cel":{"expression":"device.driver == 'gpu.tessera.io'"}}]}}`

func draClaim(class, memory string) string {
	return `{"metadata":{"name":"c","namespace":"ns"},"spec":{"devices":{"requests":[{"name":"r",
	 "exactly":{"deviceClassName":"` + class + `","capacity":{"requests":{"memory":"` + memory + `"}}}}]}}}`
}

func runDRA(t *testing.T, claims ...string) draResult {
	t.Helper()
	line := `{"id":1,"node":{"metadata":{"name":"n"}},"slices":[` + draSlice + `],"classes":[` +
		draClass + `],"claims":[` + strings.Join(claims, ",") + `]}`
	line = strings.ReplaceAll(line, "\n", "")
	var out bytes.Buffer
	if err := serveDRA(strings.NewReader(line+"\n"), &out); err != nil {
		t.Fatal(err)
	}
	var res draResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	return res
}

func TestDRA(t *testing.T) {
	res := runDRA(t, draClaim("gpu", "1500k"))
	if res.Outcome != "fit" {
		t.Fatalf("want fit, got %+v", res)
	}
	got := res.Allocations[0].Devices.Results[0].ConsumedCapacity["memory"]
	if got.Value() != 2*1024*1024 {
		t.Errorf("1500k should round up to 2Mi, got %s", got.String())
	}
	if res.Consumed["gpu.tessera.io/n/g0"]["memory"] != "2097152000" {
		t.Errorf("consumed: %v", res.Consumed)
	}
	if res := runDRA(t, draClaim("gpu", "100Gi")); res.Outcome != "unschedulable" || res.Reason != "cannot allocate all claims" {
		t.Errorf("beyond the range: %+v", res)
	}
	if res := runDRA(t, draClaim("nope", "1Gi")); res.Reason != "request r: device class nope does not exist" {
		t.Errorf("missing class: %+v", res)
	}
}
