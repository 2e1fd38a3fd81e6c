package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	internalcache "k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	frameworkplugins "k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodevolumelimits"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
)

// Case is one input line (see README.md). Services, replication controllers,
// replica sets and stateful sets are optional: PodTopologySpread derives the
// selector of its system-default constraints from them. So are claims,
// volumes and storage classes: the volume plugins read them.
type Case struct {
	ID                     json.RawMessage             `json:"id"`
	Nodes                  []*v1.Node                  `json:"nodes"`
	Pods                   []*v1.Pod                   `json:"pods"`
	Namespaces             []*v1.Namespace             `json:"namespaces"`
	Services               []*v1.Service               `json:"services,omitempty"`
	ReplicationControllers []*v1.ReplicationController `json:"replicationControllers,omitempty"`
	ReplicaSets            []*appsv1.ReplicaSet        `json:"replicaSets,omitempty"`
	StatefulSets           []*appsv1.StatefulSet       `json:"statefulSets,omitempty"`
	PersistentVolumeClaims []*v1.PersistentVolumeClaim `json:"persistentVolumeClaims,omitempty"`
	PersistentVolumes      []*v1.PersistentVolume      `json:"persistentVolumes,omitempty"`
	StorageClasses         []*storagev1.StorageClass   `json:"storageClasses,omitempty"`
	Pod                    *v1.Pod                     `json:"pod"`
	Score                  bool                        `json:"score,omitempty"`
}

// Status is a framework status as reported on the wire.
type Status struct {
	Plugin  string   `json:"plugin"`
	Code    string   `json:"code"`
	Reasons []string `json:"reasons"`
}

// NodeResult is the verdict for one node.
type NodeResult struct {
	Feasible bool     `json:"feasible"`
	Plugin   string   `json:"plugin,omitempty"`
	Code     string   `json:"code,omitempty"`
	Reasons  []string `json:"reasons,omitempty"`
}

// NodeScore is a feasible node's final score: the weighted, normalized score
// of every Score plugin that ran, and their sum.
type NodeScore struct {
	Total   int64            `json:"total"`
	Plugins map[string]int64 `json:"plugins"`
}

// Result is one output line.
type Result struct {
	ID json.RawMessage `json:"id"`
	// PreEnqueue is set when a PreEnqueue plugin (SchedulingGates) would keep
	// the pod out of the active queue: the real scheduler would never try
	// it. The rest of the result is computed anyway.
	PreEnqueue *Status                `json:"preenqueue,omitempty"`
	PreFilter  *Status                `json:"prefilter"`
	Nodes      map[string]*NodeResult `json:"nodes"`
	Message    string                 `json:"message"`
	Scores     map[string]*NodeScore  `json:"scores,omitempty"`
	Error      string                 `json:"error"`
}

// Harness holds one scheduling framework, built once the way kube-scheduler
// builds its default profile (pkg/scheduler.New), and evaluates cases against
// it. Reusing it is safe because the in-tree plugins keep everything that
// depends on the pod being scheduled in the per-cycle CycleState and read the
// cluster through the handle's SharedLister, which here points at a fresh
// Snapshot for every case. A Harness is not safe for concurrent use.
type Harness struct {
	fw      framework.Framework
	lister  *snapshotLister
	stores  map[string]toolscache.Store
	ctx     context.Context
	logger  klog.Logger
	plugins *schedulerapi.Plugins
}

// snapshotLister lets the framework keep one fwk.SharedLister for its whole
// life (plugins capture handle.SnapshotSharedLister() when they are built)
// while each case gets a brand-new Snapshot, so nothing leaks between cases.
type snapshotLister struct{ cur *internalcache.Snapshot }

func (l *snapshotLister) NodeInfos() fwk.NodeInfoLister           { return l.cur.NodeInfos() }
func (l *snapshotLister) StorageInfos() fwk.StorageInfoLister     { return l.cur.StorageInfos() }
func (l *snapshotLister) PodGroupStates() fwk.PodGroupStateLister { return l.cur.PodGroupStates() }

// noNominator stands in for the scheduling queue's PodNominator: a case has
// no nominated pods (pods waiting for room freed by preemption).
type noNominator struct{}

func (noNominator) AddNominatedPod(klog.Logger, fwk.PodInfo, *fwk.NominatingInfo) {}
func (noNominator) DeleteNominatedPodIfExists(*v1.Pod)                            {}
func (noNominator) UpdateNominatedPod(klog.Logger, *v1.Pod, fwk.PodInfo)          {}
func (noNominator) NominatedPodsForNode(string) []fwk.PodInfo                     { return nil }

// NewHarness builds the default profile exactly as the kube-scheduler binary
// does when started without a config file: latest.Default() (the v1
// KubeSchedulerConfiguration defaults: default plugins and weights, default
// plugin args) fed into profile.NewMap with the in-tree registry and the
// framework options of pkg/scheduler.New. Feature gates are the binary's
// defaults (utilfeature.DefaultFeatureGate, untouched).
//
// Informers come from a fake clientset and are never started: their stores
// are empty, which is what a synced informer sees in a cluster without PVs,
// PVCs, StorageClasses, CSINodes, ResourceClaims, DeviceClasses, ... The few
// stores a case can fill (namespaces, services, ...) are replaced per case.
func NewHarness(ctx context.Context) (*Harness, error) {
	logger := klog.FromContext(ctx)
	cfg, err := latest.Default()
	if err != nil {
		return nil, fmt.Errorf("default scheduler configuration: %w", err)
	}
	if len(cfg.Profiles) != 1 {
		return nil, fmt.Errorf("expected one default profile, got %d", len(cfg.Profiles))
	}

	// The framework observes into these at every extension point; they are
	// nil until registered.
	metrics.Register()

	client := fake.NewClientset()
	informerFactory := scheduler.NewInformerFactory(client, 0)

	// DRA plumbing, as in pkg/scheduler.New. DynamicResources is in the
	// default profile (DynamicResourceAllocation is GA), and with
	// DRAExtendedResource (beta, on) NodeResourcesFit asks the DRA manager
	// whether an extended resource that a node does not advertise is backed by
	// a DeviceClass; with no DeviceClasses the answer is always no.
	var draManager fwk.SharedDRAManager
	if utilfeature.DefaultFeatureGate.Enabled(features.DynamicResourceAllocation) {
		claimCache := assumecache.NewAssumeCache(logger, informerFactory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
		opts := tracker.Options{
			EnableDeviceTaintRules:   utilfeature.DefaultFeatureGate.Enabled(features.DRADeviceTaintRules),
			EnableConsumableCapacity: utilfeature.DefaultFeatureGate.Enabled(features.DRAConsumableCapacity),
			SliceInformer:            informerFactory.Resource().V1().ResourceSlices(),
			KubeClient:               client,
		}
		if opts.EnableDeviceTaintRules {
			opts.TaintInformer = informerFactory.Resource().V1beta2().DeviceTaintRules()
			opts.ClassInformer = informerFactory.Resource().V1().DeviceClasses()
		}
		sliceTracker, err := tracker.StartTracker(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("resource slice tracker: %w", err)
		}
		draManager = dynamicresources.NewDRAManager(ctx, claimCache, sliceTracker, informerFactory)
	}

	lister := &snapshotLister{cur: internalcache.NewEmptySnapshot()}
	// Only GangScheduling and DynamicResources consult the pod group manager,
	// for pods in a scheduling group (alpha GenericWorkload, off): an empty
	// cache serves.
	podGroups := internalcache.New(ctx, nil, utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload))

	recorder := func(string) events.EventRecorderLogger { return &events.FakeRecorder{} }
	profiles, err := profile.NewMap(ctx, cfg.Profiles, frameworkplugins.NewInTreeRegistry(), recorder,
		frameworkruntime.WithComponentConfigVersion(cfg.APIVersion),
		frameworkruntime.WithClientSet(client),
		frameworkruntime.WithInformerFactory(informerFactory),
		frameworkruntime.WithSharedDRAManager(draManager),
		frameworkruntime.WithSnapshotSharedLister(lister),
		frameworkruntime.WithParallelism(int(cfg.Parallelism)),
		frameworkruntime.WithWaitingPods(frameworkruntime.NewWaitingPodsMap()),
		frameworkruntime.WithPodsInPreBind(frameworkruntime.NewPodsInPreBindMap()),
		frameworkruntime.WithSharedCSIManager(nodevolumelimits.NewCSIManager(informerFactory.Storage().V1().CSINodes().Lister())),
		frameworkruntime.WithPodGroupManager(podGroups),
	)
	if err != nil {
		return nil, fmt.Errorf("building the default profile: %w", err)
	}
	fw, ok := profiles[cfg.Profiles[0].SchedulerName]
	if !ok {
		return nil, errors.New("default profile missing after build")
	}
	fw.SetPodNominator(noNominator{})

	return &Harness{
		fw:      fw,
		lister:  lister,
		stores:  caseStores(informerFactory),
		ctx:     ctx,
		logger:  logger,
		plugins: fw.ListPlugins(),
	}, nil
}

// caseStores are the informer stores a case fills. Writing a store of an
// informer that is never started is exactly what its reflector would do
// after listing those objects from the API server.
func caseStores(f informers.SharedInformerFactory) map[string]toolscache.Store {
	return map[string]toolscache.Store{
		"namespaces":             f.Core().V1().Namespaces().Informer().GetStore(),
		"services":               f.Core().V1().Services().Informer().GetStore(),
		"replicationControllers": f.Core().V1().ReplicationControllers().Informer().GetStore(),
		"replicaSets":            f.Apps().V1().ReplicaSets().Informer().GetStore(),
		"statefulSets":           f.Apps().V1().StatefulSets().Informer().GetStore(),
		// VolumeBinding reads claims and volumes through assume caches that are
		// passive (they read these informers' indexers), the other volume
		// plugins through listers of the same informers.
		"persistentVolumeClaims": f.Core().V1().PersistentVolumeClaims().Informer().GetStore(),
		"persistentVolumes":      f.Core().V1().PersistentVolumes().Informer().GetStore(),
		"storageClasses":         f.Storage().V1().StorageClasses().Informer().GetStore(),
	}
}

// Plugins is the expanded plugin configuration of the profile (per extension
// point, in order, with score weights).
func (h *Harness) Plugins() *schedulerapi.Plugins { return h.plugins }

// Evaluate runs one case. It mutates the case's objects (API defaulting) and
// never panics on bad input: problems are reported in Result.Error.
func (h *Harness) Evaluate(c *Case) (res *Result) {
	res = &Result{ID: c.ID, Nodes: map[string]*NodeResult{}}
	defer func() {
		if r := recover(); r != nil {
			res = &Result{ID: c.ID, Nodes: map[string]*NodeResult{}, Error: fmt.Sprintf("panic: %v", r)}
		}
	}()
	if err := h.evaluate(c, res); err != nil {
		res.Error = err.Error()
	}
	return res
}

func (h *Harness) evaluate(c *Case, res *Result) error {
	if c.Pod == nil {
		return errors.New(`missing "pod"`)
	}
	if err := defaultPod(c.Pod); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel() // stops the per-case cache's metrics goroutine
	snapshot, err := h.buildSnapshot(ctx, c)
	if err != nil {
		return err
	}
	h.lister.cur = snapshot
	if err := h.fillStores(c); err != nil {
		return err
	}
	return h.schedule(ctx, c.Pod, c.Score, res)
}

// buildSnapshot feeds the case's nodes and pods through the scheduler cache
// (the same AddNode / AddPod / UpdateSnapshot path the informer event handlers
// and each scheduling cycle use) into a new Snapshot.
func (h *Harness) buildSnapshot(ctx context.Context, c *Case) (*internalcache.Snapshot, error) {
	cache := internalcache.New(ctx, nil, utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload))
	seen := sets.New[string]()
	for i, n := range c.Nodes {
		if n == nil {
			return nil, fmt.Errorf("nodes[%d] is null", i)
		}
		if n.Name == "" {
			return nil, fmt.Errorf("nodes[%d] has no name", i)
		}
		if seen.Has(n.Name) {
			return nil, fmt.Errorf("duplicate node %q", n.Name)
		}
		seen.Insert(n.Name)
		defaultNode(n)
		cache.AddNode(h.logger, n)
	}
	for i, p := range c.Pods {
		if p == nil {
			return nil, fmt.Errorf("pods[%d] is null", i)
		}
		if err := defaultPod(p); err != nil {
			return nil, err
		}
		// The scheduler's pod informer excludes terminal pods (field selector
		// in pkg/scheduler.newPodInformer), and only assigned pods go to the
		// cache (pkg/scheduler.addPod); unassigned ones would be in the queue.
		if p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		if p.UID == c.Pod.UID {
			return nil, fmt.Errorf("pods[%d] %s/%s has the UID of the pod to schedule", i, p.Namespace, p.Name)
		}
		if err := cache.AddPod(h.logger, p); err != nil {
			return nil, fmt.Errorf("pods[%d] %s/%s: %w", i, p.Namespace, p.Name, err)
		}
	}
	snapshot := internalcache.NewEmptySnapshot()
	if err := cache.UpdateSnapshot(h.logger, snapshot); err != nil {
		return nil, fmt.Errorf("updating the snapshot: %w", err)
	}
	return snapshot, nil
}

func (h *Harness) fillStores(c *Case) error {
	objects := map[string][]metav1.Object{}
	for i, ns := range c.Namespaces {
		if ns == nil {
			return fmt.Errorf("namespaces[%d] is null", i)
		}
		defaultNamespace(ns)
		objects["namespaces"] = append(objects["namespaces"], ns)
	}
	add := func(kind string, o metav1.Object) {
		if o.GetNamespace() == "" {
			o.SetNamespace(metav1.NamespaceDefault)
		}
		objects[kind] = append(objects[kind], o)
	}
	for _, o := range c.Services {
		if o != nil {
			add("services", o)
		}
	}
	for _, o := range c.ReplicationControllers {
		if o != nil {
			add("replicationControllers", o)
		}
	}
	for _, o := range c.ReplicaSets {
		if o != nil {
			add("replicaSets", o)
		}
	}
	for _, o := range c.StatefulSets {
		if o != nil {
			add("statefulSets", o)
		}
	}
	for _, o := range c.PersistentVolumeClaims {
		if o != nil {
			add("persistentVolumeClaims", o)
		}
	}
	for _, o := range c.PersistentVolumes {
		if o != nil {
			objects["persistentVolumes"] = append(objects["persistentVolumes"], o)
		}
	}
	for _, o := range c.StorageClasses {
		if o != nil {
			defaultStorageClass(o)
			objects["storageClasses"] = append(objects["storageClasses"], o)
		}
	}
	for kind, store := range h.stores {
		items := make([]interface{}, 0, len(objects[kind]))
		for _, o := range objects[kind] {
			items = append(items, o)
		}
		if err := store.Replace(items, ""); err != nil {
			return fmt.Errorf("filling %s: %w", kind, err)
		}
	}
	return nil
}

// schedule is pkg/scheduler's schedulePod / findNodesThatFitPod /
// findNodesThatPassFilters / prioritizeNodes for one pod, minus what only
// makes sense in a live scheduler:
//
//   - every node is filtered (the scheduler stops once it has found
//     numFeasibleNodesToFind feasible nodes, which with the default
//     percentageOfNodesToScore matters from 100 nodes up, and it starts from
//     a rotating index);
//   - no nominated node is tried first and there are no nominated pods, so
//     RunFilterPluginsWithNominatedPods reduces to RunFilterPlugins;
//   - scores are computed whenever asked and at least one node is feasible
//     (the scheduler skips scoring when exactly one is);
//   - no extenders, no PostFilter (preemption), so the message has no
//     preemption suffix.
func (h *Harness) schedule(ctx context.Context, pod *v1.Pod, score bool, res *Result) error {
	fw := h.fw
	allNodes, err := h.lister.cur.NodeInfos().List()
	if err != nil {
		return err
	}

	// PreEnqueue runs when the pod enters the queue, before any cycle.
	for _, pl := range fw.PreEnqueuePlugins() {
		if s := pl.PreEnqueue(ctx, pod); !s.IsSuccess() {
			s.SetPlugin(pl.Name())
			res.PreEnqueue = toStatus(s, nil)
			break
		}
	}

	if len(allNodes) == 0 {
		res.Message = scheduler.ErrNoNodesAvailable.Error()
		return nil
	}

	state := framework.NewCycleState()
	diagnosis := framework.Diagnosis{NodeToStatus: framework.NewDefaultNodeToStatus()}
	preRes, s, unschedulablePlugins := fw.RunPreFilterPlugins(ctx, state, pod)
	diagnosis.UnschedulablePlugins = unschedulablePlugins
	var feasible []fwk.NodeInfo
	if !s.IsSuccess() {
		if !s.IsRejected() {
			return s.AsError()
		}
		// As in findNodesThatFitPod: every node gets the PreFilter status.
		diagnosis.NodeToStatus.SetAbsentNodesStatus(s)
		diagnosis.PreFilterMsg = s.Message()
		diagnosis.AddPluginStatus(s)
		res.PreFilter = toStatus(s, unschedulablePlugins)
		for _, ni := range allNodes {
			res.Nodes[ni.Node().Name] = rejected(res.PreFilter)
		}
	} else {
		nodes := allNodes
		if !preRes.AllNodes() {
			// A PreFilterResult (NodeAffinity's metadata.name matchFields)
			// narrowed the candidates; the rest get the status
			// findNodesThatFitPod records for absent nodes.
			absent := fwk.NewStatus(fwk.UnschedulableAndUnresolvable,
				fmt.Sprintf("node(s) didn't satisfy plugin(s) %v", sets.List(unschedulablePlugins)))
			diagnosis.NodeToStatus.SetAbsentNodesStatus(absent)
			absentOut := toStatus(absent, unschedulablePlugins)
			nodes = nodes[:0:0]
			for _, ni := range allNodes {
				if preRes.NodeNames.Has(ni.Node().Name) {
					nodes = append(nodes, ni)
				} else {
					res.Nodes[ni.Node().Name] = rejected(absentOut)
				}
			}
		}
		for _, ni := range nodes {
			name := ni.Node().Name
			st := fw.RunFilterPlugins(ctx, state, pod, ni)
			if st.IsSuccess() {
				feasible = append(feasible, ni)
				res.Nodes[name] = &NodeResult{Feasible: true}
				continue
			}
			res.Nodes[name] = rejected(toStatus(st, nil))
			if st.Code() == fwk.Error {
				// The scheduler aborts the cycle on a Filter error.
				return fmt.Errorf("node %s: %w", name, st.AsError())
			}
			diagnosis.NodeToStatus.Set(name, st)
			diagnosis.AddPluginStatus(st)
		}
	}

	if len(feasible) == 0 {
		fitErr := &framework.FitError{Pod: pod, NumAllNodes: h.lister.cur.NumNodesInPlacement(), Diagnosis: diagnosis}
		res.Message = fitErr.Error()
		return nil
	}
	if !score {
		return nil
	}
	if st := fw.RunPreScorePlugins(ctx, state, pod, feasible); !st.IsSuccess() {
		return st.AsError()
	}
	scores, st := fw.RunScorePlugins(ctx, state, pod, feasible)
	if !st.IsSuccess() {
		return st.AsError()
	}
	res.Scores = make(map[string]*NodeScore, len(scores))
	for _, ns := range scores {
		out := &NodeScore{Total: ns.TotalScore, Plugins: make(map[string]int64, len(ns.Scores))}
		for _, ps := range ns.Scores {
			out.Plugins[ps.Name] = ps.Score
		}
		res.Scores[ns.Name] = out
	}
	return nil
}

// toStatus renders a framework status. Statuses the framework builds itself
// for a PreFilterResult carry no plugin name; for those the plugins that
// narrowed the node set are named instead (comma-separated).
func toStatus(s *fwk.Status, narrowing sets.Set[string]) *Status {
	plugin := s.Plugin()
	if plugin == "" && narrowing.Len() > 0 {
		plugin = strings.Join(sets.List(narrowing), ",")
	}
	reasons := s.Reasons()
	if reasons == nil {
		reasons = []string{}
	}
	return &Status{Plugin: plugin, Code: s.Code().String(), Reasons: reasons}
}

func rejected(s *Status) *NodeResult {
	return &NodeResult{Feasible: false, Plugin: s.Plugin, Code: s.Code, Reasons: s.Reasons}
}
