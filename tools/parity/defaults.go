package main

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/apis/core"
	corev1defaults "k8s.io/kubernetes/pkg/apis/core/v1"
	podregistry "k8s.io/kubernetes/pkg/registry/core/pod"
)

// The objects of a case arrive as a client would send them. Before the
// scheduler sees an object, the API server has
//
//  1. decoded it with the v1 defaulting functions (SetObjectDefaults_* from
//     k8s.io/kubernetes/pkg/apis/core/v1), and
//  2. for pods, run the registry strategy's PrepareForCreate
//     (k8s.io/kubernetes/pkg/registry/core/pod), which merges
//     matchLabelKeys / mismatchLabelKeys of pod (anti-)affinity terms and
//     topology spread constraints into their labelSelector.
//
// Both are applied here, with the upstream code. What scheduling sees of
// step 1: a container's requests default to its limits (and pod-level
// requests to pod-level limits), hostNetwork pods get hostPort =
// containerPort, a node's allocatable defaults to its capacity, a
// namespace gets the kubernetes.io/metadata.name label, and
// spec.schedulerName defaults to default-scheduler. The request path also
// supplies metadata.namespace ("default" here when empty), and the server
// assigns metadata.uid (the scheduler cache keys pods by UID).
//
// Admission plugins are NOT applied (which ones run depends on the API
// server's configuration): no DefaultTolerationSeconds tolerations, no
// Priority resolution from priorityClassName, no LimitRanger defaults.

func defaultNode(n *v1.Node) {
	corev1defaults.SetObjectDefaults_Node(n)
}

// defaultStorageClass applies the API server's default binding mode
// (Immediate): the volume plugins treat a class without one as an error.
func defaultStorageClass(sc *storagev1.StorageClass) {
	if sc.VolumeBindingMode == nil {
		mode := storagev1.VolumeBindingImmediate
		sc.VolumeBindingMode = &mode
	}
}

func defaultNamespace(ns *v1.Namespace) {
	corev1defaults.SetObjectDefaults_Namespace(ns)
}

// defaultPod applies the API server's create-time defaulting to pod in place.
func defaultPod(pod *v1.Pod) error {
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	if pod.UID == "" {
		// Deterministic, and unique as long as namespace/name is (which the
		// API server enforces).
		pod.UID = types.UID("parity-" + pod.Namespace + "-" + pod.Name)
	}
	presetPullPolicies(pod)
	corev1defaults.SetObjectDefaults_Pod(pod)
	if hasLabelKeys(pod) {
		return mergeLabelKeys(pod)
	}
	return nil
}

// pullPolicies memoizes, per image reference, the imagePullPolicy that
// SetDefaults_Container gives a container without one. Deriving it parses the
// image reference with a regular expression, which made up most of the
// defaulting time of a case with hundreds of pods; the policy itself does not
// matter to the scheduler, but the upstream function still decides it.
var pullPolicies = map[string]v1.PullPolicy{}

var pullPoliciesMu sync.Mutex

func presetPullPolicies(pod *v1.Pod) {
	preset := func(cs []v1.Container) {
		for i := range cs {
			if cs[i].ImagePullPolicy == "" {
				cs[i].ImagePullPolicy = pullPolicyFor(cs[i].Image)
			}
		}
	}
	preset(pod.Spec.InitContainers)
	preset(pod.Spec.Containers)
}

func pullPolicyFor(image string) v1.PullPolicy {
	pullPoliciesMu.Lock()
	defer pullPoliciesMu.Unlock()
	policy, ok := pullPolicies[image]
	if !ok {
		c := v1.Container{Image: image}
		corev1defaults.SetDefaults_Container(&c)
		policy = c.ImagePullPolicy
		if len(pullPolicies) < 1<<16 { // bound the memory on adversarial input
			pullPolicies[image] = policy
		}
	}
	return policy
}

// hasLabelKeys reports whether PrepareForCreate would change pod's
// scheduling-relevant spec (the matchLabelKeys merge); if not, the
// round trip through the internal type is skipped (it costs tens of µs,
// and a case may have hundreds of pods).
func hasLabelKeys(pod *v1.Pod) bool {
	for _, c := range pod.Spec.TopologySpreadConstraints {
		if len(c.MatchLabelKeys) > 0 {
			return true
		}
	}
	a := pod.Spec.Affinity
	if a == nil {
		return false
	}
	var terms []v1.PodAffinityTerm
	if a.PodAffinity != nil {
		terms = append(terms, a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	if a.PodAntiAffinity != nil {
		terms = append(terms, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	for _, t := range terms {
		if len(t.MatchLabelKeys) > 0 || len(t.MismatchLabelKeys) > 0 {
			return true
		}
	}
	return false
}

// mergeLabelKeys runs the pod registry strategy's PrepareForCreate on an
// internal copy of pod and keeps the resulting spec. Metadata and status are
// kept as given: PrepareForCreate also resets the status to a new pod's, which
// is wrong for the already-bound pods of a case.
func mergeLabelKeys(pod *v1.Pod) error {
	internal := &core.Pod{}
	if err := corev1defaults.Convert_v1_Pod_To_core_Pod(pod, internal, nil); err != nil {
		return fmt.Errorf("pod %s/%s: converting to the internal type: %w", pod.Namespace, pod.Name, err)
	}
	podregistry.Strategy.PrepareForCreate(context.Background(), internal)
	out := &v1.Pod{}
	if err := corev1defaults.Convert_core_Pod_To_v1_Pod(internal, out, nil); err != nil {
		return fmt.Errorf("pod %s/%s: converting back from the internal type: %w", pod.Namespace, pod.Name, err)
	}
	pod.Spec = out.Spec
	return nil
}
