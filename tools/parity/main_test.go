package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
)

var (
	harnessOnce sync.Once
	harness     *Harness
	harnessErr  error
)

// testHarness builds the (expensive) framework once for all tests.
func testHarness(t testing.TB) *Harness {
	t.Helper()
	harnessOnce.Do(func() { harness, harnessErr = NewHarness(context.Background()) })
	if harnessErr != nil {
		t.Fatal(harnessErr)
	}
	return harness
}

// --- object builders -------------------------------------------------------

type nodeOpt func(*v1.Node)

func node(name, cpu, mem string, opts ...nodeOpt) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelHostname: name}},
		Status: v1.NodeStatus{Capacity: v1.ResourceList{
			v1.ResourceCPU:    resource.MustParse(cpu),
			v1.ResourceMemory: resource.MustParse(mem),
			v1.ResourcePods:   resource.MustParse("110"),
		}},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

func withLabel(k, v string) nodeOpt { return func(n *v1.Node) { n.Labels[k] = v } }
func withTaint(k, v string, e v1.TaintEffect) nodeOpt {
	return func(n *v1.Node) { n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: k, Value: v, Effect: e}) }
}
func cordoned() nodeOpt { return func(n *v1.Node) { n.Spec.Unschedulable = true } }

type podOpt func(*v1.Pod)

func pod(name string, opts ...podOpt) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{}},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox"}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func on(nodeName string) podOpt { return func(p *v1.Pod) { p.Spec.NodeName = nodeName } }
func label(k, v string) podOpt  { return func(p *v1.Pod) { p.Labels[k] = v } }
func selector(k, v string) podOpt {
	return func(p *v1.Pod) { p.Spec.NodeSelector = map[string]string{k: v} }
}
func requests(cpu, mem string) podOpt { return resources(cpu, mem, false) }
func limitsOnly(cpu, mem string) podOpt {
	return resources(cpu, mem, true)
}
func resources(cpu, mem string, limits bool) podOpt {
	return func(p *v1.Pod) {
		rl := v1.ResourceList{}
		if cpu != "" {
			rl[v1.ResourceCPU] = resource.MustParse(cpu)
		}
		if mem != "" {
			rl[v1.ResourceMemory] = resource.MustParse(mem)
		}
		if limits {
			p.Spec.Containers[0].Resources.Limits = rl
		} else {
			p.Spec.Containers[0].Resources.Requests = rl
		}
	}
}
func hostPort(port int32) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, v1.ContainerPort{ContainerPort: port, HostPort: port})
	}
}
func antiAffinity(k, v, topologyKey string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{k: v}},
				TopologyKey:   topologyKey,
			}},
		}}
	}
}
func spread(maxSkew int32, topologyKey string, k, v string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, v1.TopologySpreadConstraint{
			MaxSkew:           maxSkew,
			TopologyKey:       topologyKey,
			WhenUnsatisfiable: v1.DoNotSchedule,
			LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{k: v}},
		})
	}
}
func nodeNameAffinity(names ...string) podOpt {
	return func(p *v1.Pod) {
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: names}},
			}}},
		}}
	}
}

// --- table -----------------------------------------------------------------

func ok() *NodeResult { return &NodeResult{Feasible: true} }
func no(plugin, code string, reasons ...string) *NodeResult {
	return &NodeResult{Plugin: plugin, Code: code, Reasons: reasons}
}

const (
	unsched    = "Unschedulable"
	unresolved = "UnschedulableAndUnresolvable"
)

// tableCase is one case of TestCases: the expected verdict per node, the
// PreFilter status and the rendered FitError message.
type tableCase struct {
	name      string
	c         Case
	nodes     map[string]*NodeResult
	prefilter *Status
	message   string
}

func TestCases(t *testing.T) {
	h := testHarness(t)
	zone := v1.LabelTopologyZone
	tests := []tableCase{
		{
			name: "insufficient cpu",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "1", "8Gi")},
				Pods:  []*v1.Pod{pod("busy", on("a"), requests("3", "1Gi"))},
				Pod:   pod("p", requests("2", "1Gi")),
			},
			nodes: map[string]*NodeResult{
				// Fits the allocatable but not what is left: preemption could help.
				"a": no("NodeResourcesFit", unsched, "Insufficient cpu"),
				// Bigger than the node: Unresolvable.
				"b": no("NodeResourcesFit", unresolved, "Insufficient cpu"),
			},
			message: "0/2 nodes are available: 2 Insufficient cpu.",
		},
		{
			name: "insufficient cpu and memory; requests defaulted from limits",
			c: Case{
				Nodes: []*v1.Node{node("a", "1", "1Gi"), node("b", "8", "64Gi")},
				Pod:   pod("p", limitsOnly("2", "2Gi")),
			},
			nodes: map[string]*NodeResult{
				"a": no("NodeResourcesFit", unresolved, "Insufficient cpu", "Insufficient memory"),
				"b": ok(),
			},
		},
		{
			name: "nodeSelector mismatch",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi", withLabel("disk", "ssd")), node("b", "4", "8Gi")},
				Pod:   pod("p", selector("disk", "ssd")),
			},
			nodes: map[string]*NodeResult{
				"a": ok(),
				"b": no("NodeAffinity", unresolved, "node(s) didn't match Pod's node affinity/selector"),
			},
		},
		{
			name: "untolerated taint",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi", withTaint("gpu", "true", v1.TaintEffectNoSchedule)), node("b", "4", "8Gi", withTaint("x", "", v1.TaintEffectPreferNoSchedule))},
				Pod:   pod("p"),
			},
			nodes: map[string]*NodeResult{
				"a": no("TaintToleration", unresolved, "node(s) had untolerated taint(s)"),
				"b": ok(), // PreferNoSchedule only scores
			},
		},
		{
			name: "cordoned nodes; NodeUnschedulable runs before TaintToleration",
			c: Case{
				Nodes: []*v1.Node{
					node("a", "4", "8Gi", cordoned(), withTaint(v1.TaintNodeUnschedulable, "", v1.TaintEffectNoSchedule)),
					node("b", "4", "8Gi", cordoned()),
					node("c", "4", "8Gi", withTaint("dedicated", "infra", v1.TaintEffectNoExecute)),
				},
				Pod: pod("p"),
			},
			nodes: map[string]*NodeResult{
				"a": no("NodeUnschedulable", unresolved, "node(s) were unschedulable"),
				"b": no("NodeUnschedulable", unresolved, "node(s) were unschedulable"),
				"c": no("TaintToleration", unresolved, "node(s) had untolerated taint(s)"),
			},
			message: "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) were unschedulable.",
		},
		{
			name: "host port conflict",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "4", "8Gi")},
				Pods:  []*v1.Pod{pod("web", on("a"), hostPort(8080))},
				Pod:   pod("p", hostPort(8080)),
			},
			nodes: map[string]*NodeResult{
				"a": no("NodePorts", unsched, "node(s) didn't have free ports for the requested pod ports"),
				"b": ok(),
			},
		},
		{
			name: "required anti-affinity of the incoming pod against an existing pod",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "4", "8Gi")},
				Pods:  []*v1.Pod{pod("web-0", on("a"), label("app", "web"))},
				Pod:   pod("web-1", label("app", "web"), antiAffinity("app", "web", v1.LabelHostname)),
			},
			nodes: map[string]*NodeResult{
				"a": no("InterPodAffinity", unsched, "node(s) didn't match pod anti-affinity rules"),
				"b": ok(),
			},
		},
		{
			name: "required anti-affinity of an existing pod against the incoming pod",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi", withLabel(zone, "z1")), node("b", "4", "8Gi", withLabel(zone, "z1")), node("c", "4", "8Gi", withLabel(zone, "z2"))},
				Pods:  []*v1.Pod{pod("db", on("a"), antiAffinity("app", "web", zone))},
				Pod:   pod("web", label("app", "web")),
			},
			nodes: map[string]*NodeResult{
				"a": no("InterPodAffinity", unsched, "node(s) didn't satisfy existing pods anti-affinity rules"),
				"b": no("InterPodAffinity", unsched, "node(s) didn't satisfy existing pods anti-affinity rules"),
				"c": ok(),
			},
		},
		{
			name: "topology spread DoNotSchedule skew",
			c: Case{
				Nodes: []*v1.Node{
					node("a", "4", "8Gi", withLabel(zone, "z1")),
					node("b", "4", "8Gi", withLabel(zone, "z2")),
					node("c", "4", "8Gi"), // no zone label
				},
				Pods: []*v1.Pod{pod("x-0", on("a"), label("app", "x")), pod("x-1", on("a"), label("app", "x")), pod("x-2", on("b"), label("app", "x"))},
				Pod:  pod("x-3", label("app", "x"), spread(1, zone, "app", "x")),
			},
			nodes: map[string]*NodeResult{
				"a": no("PodTopologySpread", unsched, "node(s) didn't match pod topology spread constraints"),
				"b": ok(),
				"c": no("PodTopologySpread", unresolved, "node(s) didn't match pod topology spread constraints (missing required label)"),
			},
		},
		{
			name: "PreFilterResult narrows the nodes (matchFields metadata.name)",
			c: Case{
				Nodes: []*v1.Node{node("a", "1", "8Gi"), node("b", "4", "8Gi"), node("c", "4", "8Gi")},
				Pod:   pod("p", requests("2", ""), nodeNameAffinity("a")),
			},
			nodes: map[string]*NodeResult{
				"a": no("NodeResourcesFit", unresolved, "Insufficient cpu"),
				"b": no("NodeAffinity", unresolved, "node(s) didn't satisfy plugin(s) [NodeAffinity]"),
				"c": no("NodeAffinity", unresolved, "node(s) didn't satisfy plugin(s) [NodeAffinity]"),
			},
			message: "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't satisfy plugin(s) [NodeAffinity].",
		},
		{
			name: "PreFilterResult names no existing node",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "4", "8Gi")},
				Pod:   pod("p", nodeNameAffinity("gone")),
			},
			nodes: map[string]*NodeResult{
				"a": no("NodeAffinity", unresolved, "node(s) didn't satisfy plugin(s) [NodeAffinity]"),
				"b": no("NodeAffinity", unresolved, "node(s) didn't satisfy plugin(s) [NodeAffinity]"),
			},
			message: "0/2 nodes are available: 2 node(s) didn't satisfy plugin(s) [NodeAffinity].",
		},
		{
			name: "PreFilter rejects every node",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "4", "8Gi")},
				Pod: pod("p", func(p *v1.Pod) {
					nodeNameAffinity("a")(p)
					terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
					terms[0].MatchFields = append(terms[0].MatchFields, v1.NodeSelectorRequirement{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{"b"}})
				}),
			},
			prefilter: &Status{Plugin: "NodeAffinity", Code: unresolved, Reasons: []string{"pod affinity terms conflict"}},
			nodes: map[string]*NodeResult{
				"a": no("NodeAffinity", unresolved, "pod affinity terms conflict"),
				"b": no("NodeAffinity", unresolved, "pod affinity terms conflict"),
			},
			message: "0/2 nodes are available: pod affinity terms conflict.",
		},
		{
			name: "anti-affinity namespaceSelector reads the case's namespaces",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "4", "8Gi")},
				Namespaces: []*v1.Namespace{
					{ObjectMeta: metav1.ObjectMeta{Name: "default"}},
					{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}}},
					{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}},
				},
				Pods: []*v1.Pod{
					pod("a-web", on("a"), label("app", "web"), func(p *v1.Pod) { p.Namespace = "team-a" }),
					pod("b-web", on("b"), label("app", "web"), func(p *v1.Pod) { p.Namespace = "team-b" }),
				},
				Pod: pod("p", antiAffinity("app", "web", v1.LabelHostname), func(p *v1.Pod) {
					p.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].NamespaceSelector =
						&metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
				}),
			},
			nodes: map[string]*NodeResult{
				"a": no("InterPodAffinity", unsched, "node(s) didn't match pod anti-affinity rules"),
				"b": ok(),
			},
		},
		{
			name: "matchLabelKeys is merged into the selector as the API server does",
			c: Case{
				Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "4", "8Gi")},
				Pods: []*v1.Pod{
					pod("web-v1", on("a"), label("app", "web"), label("version", "v1")),
					pod("web-v2", on("b"), label("app", "web"), label("version", "v2")),
				},
				Pod: pod("p", label("app", "web"), label("version", "v2"), antiAffinity("app", "web", v1.LabelHostname), func(p *v1.Pod) {
					p.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].MatchLabelKeys = []string{"version"}
				}),
			},
			nodes: map[string]*NodeResult{
				"a": ok(),
				"b": no("InterPodAffinity", unsched, "node(s) didn't match pod anti-affinity rules"),
			},
		},
		{
			name: "terminal and unbound pods are not in the scheduler cache",
			c: Case{
				Nodes: []*v1.Node{node("a", "1", "8Gi")},
				Pods: []*v1.Pod{
					pod("done", on("a"), requests("1", ""), func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }),
					pod("pending", requests("1", "")),
				},
				Pod: pod("p", requests("1", "")),
			},
			nodes: map[string]*NodeResult{"a": ok()},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := h.Evaluate(&tc.c)
			if res.Error != "" {
				t.Fatalf("error: %s", res.Error)
			}
			if !reflect.DeepEqual(res.PreFilter, tc.prefilter) {
				t.Errorf("prefilter = %s, want %s", js(res.PreFilter), js(tc.prefilter))
			}
			if !reflect.DeepEqual(res.Nodes, tc.nodes) {
				t.Errorf("nodes =\n  %s\nwant\n  %s", js(res.Nodes), js(tc.nodes))
			}
			if res.Message != tc.message {
				t.Errorf("message = %q, want %q", res.Message, tc.message)
			}
		})
	}
}

func TestScores(t *testing.T) {
	h := testHarness(t)
	res := h.Evaluate(&Case{
		Nodes: []*v1.Node{node("a", "4", "8Gi"), node("b", "4", "8Gi")},
		Pods:  []*v1.Pod{pod("busy", on("a"), requests("2", "4Gi"))},
		Pod:   pod("p", requests("1", "1Gi")),
		Score: true,
	})
	if res.Error != "" {
		t.Fatal(res.Error)
	}
	a, b := res.Scores["a"], res.Scores["b"]
	if a == nil || b == nil {
		t.Fatalf("scores = %s", js(res.Scores))
	}
	for name, s := range res.Scores {
		var sum int64
		for _, v := range s.Plugins {
			sum += v
		}
		if sum != s.Total {
			t.Errorf("%s: plugins sum to %d, total %d", name, sum, s.Total)
		}
	}
	// LeastAllocated (weight 1): a is busier, so it scores lower.
	if a.Plugins["NodeResourcesFit"] >= b.Plugins["NodeResourcesFit"] {
		t.Errorf("NodeResourcesFit a=%d b=%d, want a < b", a.Plugins["NodeResourcesFit"], b.Plugins["NodeResourcesFit"])
	}
	// Node b: (4-1)/4 cpu and (8-1)/8 memory free -> (75+87)/2 = 81.
	if got := b.Plugins["NodeResourcesFit"]; got != 81 {
		t.Errorf("NodeResourcesFit(b) = %d, want 81", got)
	}
}

// TestSystemDefaultSpreading checks that the optional services reach
// PodTopologySpread: its system-default constraints (ScheduleAnyway, so
// scoring only) apply to a pod without constraints only when a Service,
// ReplicationController, ReplicaSet or StatefulSet selects it.
func TestSystemDefaultSpreading(t *testing.T) {
	h := testHarness(t)
	build := func(withService bool) *Result {
		c := &Case{
			Nodes: []*v1.Node{
				node("a", "8", "8Gi", withLabel(v1.LabelTopologyZone, "z1")),
				node("b", "8", "8Gi", withLabel(v1.LabelTopologyZone, "z2")),
			},
			Pods: []*v1.Pod{
				pod("web-0", on("a"), label("app", "web")),
				pod("web-1", on("a"), label("app", "web")),
				pod("web-2", on("a"), label("app", "web")),
			},
			Pod:   pod("web-3", label("app", "web")),
			Score: true,
		}
		if withService {
			c.Services = []*v1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: v1.ServiceSpec{Selector: map[string]string{"app": "web"}}}}
		}
		res := h.Evaluate(c)
		if res.Error != "" {
			t.Fatal(res.Error)
		}
		return res
	}
	if res := build(false); res.Scores["a"] == nil {
		t.Fatalf("no scores: %s", js(res))
	} else if _, ran := res.Scores["a"].Plugins["PodTopologySpread"]; ran {
		t.Errorf("PodTopologySpread scored a pod nothing selects: %s", js(res.Scores))
	}
	res := build(true)
	a, b := res.Scores["a"].Plugins["PodTopologySpread"], res.Scores["b"].Plugins["PodTopologySpread"]
	if a >= b {
		t.Errorf("PodTopologySpread a=%d b=%d, want a < b (a already runs 3 replicas): %s", a, b, js(res.Scores))
	}
}

func TestProtocol(t *testing.T) {
	h := testHarness(t)
	in := strings.Join([]string{
		`{"id": "good", "nodes": [{"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "1", "memory": "1Gi", "pods": "10"}}}], "pods": [], "namespaces": [], "pod": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}}`,
		`{"id": "bad", "nodes": [{"metadata": {"name": 7}}], "pod": {}}`,
		`not json at all`,
		`{"id": 42, "nodes": []}`,
		``,
		`{"id": "none", "nodes": [], "pods": [], "namespaces": [], "pod": {"metadata": {"name": "p"}}}`,
	}, "\n")
	// Two workers, so that answers can complete out of order and must be put
	// back in input order.
	h2, err := NewHarness(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := serve([]*Harness{h, h2}, strings.NewReader(in), &out, nil); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("got %d lines, want 5:\n%s", len(lines), out.String())
	}
	var results []map[string]any
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("bad output line %q: %v", l, err)
		}
		results = append(results, m)
	}
	if got := results[0]["message"]; got != "0/1 nodes are available: 1 Insufficient cpu." {
		t.Errorf("good: message %q", got)
	}
	if results[0]["error"] != "" || results[0]["prefilter"] != nil {
		t.Errorf("good: %s", lines[0])
	}
	for i, id := range []any{"bad", nil, 42.0} {
		r := results[i+1]
		if r["id"] != id || r["error"] == "" {
			t.Errorf("line %d: want id %v and an error, got %s", i+2, id, lines[i+1])
		}
	}
	if got := results[4]["message"]; got != "no nodes available to schedule pods" {
		t.Errorf("none: message %q", got)
	}
}

func TestSchedulingGates(t *testing.T) {
	h := testHarness(t)
	res := h.Evaluate(&Case{
		Nodes: []*v1.Node{node("a", "4", "8Gi")},
		Pod:   pod("p", func(p *v1.Pod) { p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "example.com/wait"}} }),
	})
	want := &Status{Plugin: "SchedulingGates", Code: unresolved, Reasons: []string{"waiting for scheduling gates: [example.com/wait]"}}
	if res.Error != "" || !reflect.DeepEqual(res.PreEnqueue, want) {
		t.Errorf("preenqueue = %s (error %q), want %s", js(res.PreEnqueue), res.Error, js(want))
	}
	if !res.Nodes["a"].Feasible {
		t.Errorf("filters still run for a gated pod: %s", js(res.Nodes))
	}
}

func TestDefaultProfile(t *testing.T) {
	h := testHarness(t)
	var filters []string
	for _, p := range h.Plugins().Filter.Enabled {
		filters = append(filters, p.Name)
	}
	want := []string{"NodeUnschedulable", "NodeName", "TaintToleration", "NodeAffinity", "NodePorts", "NodeResourcesFit",
		"VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone", "PodTopologySpread", "InterPodAffinity",
		"DynamicResources", "NodeDeclaredFeatures"}
	if !reflect.DeepEqual(filters, want) {
		t.Errorf("filter plugins = %v, want %v", filters, want)
	}
}

// --- timing ----------------------------------------------------------------

// randomCase builds a cluster of nNodes nodes in 3 zones with nPods bound pods
// (some with labels, host ports and anti-affinity) and a pending pod with a
// mix of constraints.
func randomCase(r *rand.Rand, nNodes, nPods int) *Case {
	c := &Case{Namespaces: []*v1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "default"}}}, Score: true}
	for i := 0; i < nNodes; i++ {
		opts := []nodeOpt{withLabel(v1.LabelTopologyZone, fmt.Sprintf("z%d", i%3))}
		if r.Intn(10) == 0 {
			opts = append(opts, withTaint("dedicated", "gpu", v1.TaintEffectNoSchedule))
		}
		if r.Intn(20) == 0 {
			opts = append(opts, cordoned())
		}
		c.Nodes = append(c.Nodes, node(fmt.Sprintf("n%03d", i), "16", "64Gi", opts...))
	}
	apps := []string{"web", "db", "cache", "batch"}
	for i := 0; i < nPods; i++ {
		opts := []podOpt{on(fmt.Sprintf("n%03d", r.Intn(nNodes))), label("app", apps[r.Intn(len(apps))]),
			requests(fmt.Sprintf("%dm", 100+r.Intn(900)), fmt.Sprintf("%dMi", 128+r.Intn(2048)))}
		if r.Intn(10) == 0 {
			opts = append(opts, hostPort(int32(8000+r.Intn(5))))
		}
		if r.Intn(10) == 0 {
			opts = append(opts, antiAffinity("app", apps[r.Intn(len(apps))], v1.LabelHostname))
		}
		c.Pods = append(c.Pods, pod(fmt.Sprintf("p%04d", i), opts...))
	}
	opts := []podOpt{label("app", "web"), requests(fmt.Sprintf("%dm", 500+r.Intn(4000)), "1Gi"),
		spread(2, v1.LabelTopologyZone, "app", "web"), antiAffinity("app", "db", v1.LabelHostname)}
	if r.Intn(2) == 0 {
		opts = append(opts, hostPort(8000))
	}
	c.Pod = pod("pending", opts...)
	return c
}

// TestTiming evaluates 1,000 random cases of 50 nodes and 200 bound pods end
// to end (JSON in, JSON out) on one worker and logs the per-case time; run
// with -v to see it. With PARITY_CASES_OUT=file it also writes the cases there.
func TestTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	h := testHarness(t)
	r := rand.New(rand.NewSource(1))
	var in bytes.Buffer
	const n = 1000
	for i := 0; i < n; i++ {
		c := randomCase(r, 50, 200)
		c.ID = json.RawMessage(fmt.Sprintf("%d", i))
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		in.Write(b)
		in.WriteByte('\n')
	}
	if path := os.Getenv("PARITY_CASES_OUT"); path != "" {
		// Keep the input, to time the built binary on it (README.md).
		if err := os.WriteFile(path, in.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	start := time.Now()
	if err := serve([]*Harness{h}, &in, &out, nil); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	feasible, errs := 0, 0
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var res Result
		if err := json.Unmarshal([]byte(l), &res); err != nil {
			t.Fatal(err)
		}
		if res.Error != "" {
			errs++
			t.Errorf("case %s: %s", res.ID, res.Error)
		}
		if res.Message == "" {
			feasible++
		}
	}
	t.Logf("%d cases of 50 nodes + 200 pods, with scores: %d µs per case (%d schedulable, %d errors)",
		n, elapsed.Microseconds()/n, feasible, errs)
}

// TestDecodersAgree checks that the fast decoder builds exactly the objects
// the API server's decoder (sigs.k8s.io/json) builds.
func TestDecodersAgree(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	lines := [][]byte{
		[]byte(`{"id":"x","nodes":[{"metadata":{"name":"n","labels":{"a":"b"}},"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]},"status":{"capacity":{"cpu":2,"memory":"1.5Gi","nvidia.com/gpu":"8"}}}],` +
			`"pod":{"metadata":{"name":"p","creationTimestamp":"2024-01-02T03:04:05Z"},"spec":{"priority":7,"overhead":{"cpu":"250m"},"containers":[{"name":"c","ports":[{"containerPort":80,"hostPort":80,"protocol":"UDP"}],` +
			`"resources":{"limits":{"cpu":"0.5","memory":"1500Mi","ephemeral-storage":"1e9"}}}],"topologySpreadConstraints":[{"maxSkew":1,"topologyKey":"z","whenUnsatisfiable":"DoNotSchedule","minDomains":2,"nodeAffinityPolicy":"Ignore"}]}},` +
			`"Score":true,"score":true,"unknown":{"x":[1,2]}}`),
	}
	for i := 0; i < 20; i++ {
		c := randomCase(r, 5, 20)
		// An absent or null id decodes to nil with one decoder and to "null"
		// with the other; both are written back as null.
		c.ID = json.RawMessage(fmt.Sprintf(`"case-%d"`, i))
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, b)
	}
	for i, line := range lines {
		var fast, ref Case
		if err := caseJSON.Unmarshal(line, &fast); err != nil {
			t.Fatalf("line %d: json-iterator: %v", i, err)
		}
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(line, &ref); err != nil {
			t.Fatalf("line %d: sigs.k8s.io/json: %v", i, err)
		}
		if !reflect.DeepEqual(fast, ref) {
			t.Errorf("line %d: decoders disagree:\n%s\n%s", i, js(fast), js(ref))
		}
	}
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
