// The -dra mode: the pinned release's structured DRA allocator
// (k8s.io/dynamic-resource-allocation/structured, with the features the
// scheduler's DynamicResources plugin derives from the default feature gates)
// decides, for one node, whether a pod's unallocated ResourceClaims can be
// allocated from the node's ResourceSlices, and how. Tessera's
// shared/core/dra is compared against it (bench/parity_dra.py).
//
// Input line:
//
//	{"id": ..., "node": <v1.Node>, "slices": [<ResourceSlice>...],
//	 "classes": [<DeviceClass>...], "allocated": [<ResourceClaim>...],
//	 "claims": [<ResourceClaim>...]}
//
// Output line:
//
//	{"id": ..., "outcome": "fit" | "unschedulable" | "error",
//	 "reason": "...", "allocations": [<AllocationResult>...],
//	 "consumed": {"driver/pool/device": {"memory": "<integer value>"}}}
//
// "allocated" are claims with status.allocation: what they hold is the
// AllocatedState, built as the plugin's claim tracker builds it (admin access
// holds nothing, a result with a shareID consumes capacity, any other holds
// its device). "consumed" is, per shared device, what the allocated claims
// and the new allocations consume together.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	resourcedefaults "k8s.io/kubernetes/pkg/apis/resource/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
)

type draCase struct {
	ID        json.RawMessage              `json:"id"`
	Node      v1.Node                      `json:"node"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Classes   []*resourceapi.DeviceClass   `json:"classes"`
	Allocated []*resourceapi.ResourceClaim `json:"allocated"`
	Claims    []*resourceapi.ResourceClaim `json:"claims"`
}

type draResult struct {
	ID          json.RawMessage                `json:"id"`
	Outcome     string                         `json:"outcome"`
	Reason      string                         `json:"reason,omitempty"`
	Allocations []resourceapi.AllocationResult `json:"allocations,omitempty"`
	Consumed    map[string]map[string]string   `json:"consumed,omitempty"`
}

// draFilterTimeout is the DynamicResources plugin's default filter timeout.
const draFilterTimeout = 10 * time.Second

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// draFeatures are the allocator features kube-scheduler uses under the
// release's default feature gates.
func draFeatures() (structured.Features, feature.Features) {
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	return dynamicresources.AllocatorFeatures(fts), fts
}

func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range claims {
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

func evalDRA(ctx context.Context, c *draCase) draResult {
	res := draResult{ID: c.ID}
	// What the API server applies on create (allocationMode ExactCount, count 1,
	// toleration operator Equal, ...), as the harness defaults its other objects.
	for _, claim := range c.Claims {
		resourcedefaults.SetObjectDefaults_ResourceClaim(claim)
	}
	for _, claim := range c.Allocated {
		resourcedefaults.SetObjectDefaults_ResourceClaim(claim)
	}
	for _, slice := range c.Slices {
		resourcedefaults.SetObjectDefaults_ResourceSlice(slice)
	}
	features, fts := draFeatures()
	classes := classLister{}
	for _, cl := range c.Classes {
		classes[cl.Name] = cl
	}
	// DynamicResources' PreFilter refuses a request naming a class that does
	// not exist before any node is tried (validateDeviceClass in the plugin);
	// the allocator alone would report an error instead.
	for _, claim := range c.Claims {
		for _, request := range claim.Spec.Devices.Requests {
			if request.Exactly != nil {
				if _, ok := classes[request.Exactly.DeviceClassName]; !ok {
					res.Outcome = "unschedulable"
					res.Reason = fmt.Sprintf("request %s: device class %s does not exist", request.Name, request.Exactly.DeviceClassName)
					return res
				}
			}
			for _, sub := range request.FirstAvailable {
				if _, ok := classes[sub.DeviceClassName]; !ok {
					res.Outcome = "unschedulable"
					res.Reason = fmt.Sprintf("request %s/%s: device class %s does not exist", request.Name, sub.Name, sub.DeviceClassName)
					return res
				}
			}
		}
	}
	state := allocatedState(c.Allocated)
	cache := cel.NewCache(10, cel.Features{
		EnableConsumableCapacity: fts.EnableDRAConsumableCapacity,
		EnableListTypeAttributes: fts.EnableDRAListTypeAttributes,
	})
	allocator, err := structured.NewAllocator(ctx, features, state, classes, c.Slices, cache)
	if err != nil {
		res.Outcome, res.Reason = "error", err.Error()
		return res
	}
	// kube-scheduler gives the allocator DRASchedulerFilterTimeout (10 s by
	// default) per node; its search is exponential on some claims.
	ctx, cancel := context.WithTimeout(ctx, draFilterTimeout)
	defer cancel()
	results, err := allocator.Allocate(ctx, &c.Node, c.Claims)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		res.Outcome = "timeout"
		res.Reason = fmt.Sprintf("node %s: timed out trying to allocate devices", c.Node.Name)
		return res
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		res.Outcome, res.Reason = "unschedulable", err.Error()
		return res
	case err != nil:
		res.Outcome, res.Reason = "error", err.Error()
		return res
	case len(results) != len(c.Claims):
		res.Outcome, res.Reason = "unschedulable", "cannot allocate all claims"
		return res
	}
	res.Outcome, res.Allocations = "fit", results
	// What every shared device has consumed once these allocations are made.
	total := map[string]map[string]*resource.Quantity{}
	add := func(id string, consumed map[resourceapi.QualifiedName]resource.Quantity) {
		if total[id] == nil {
			total[id] = map[string]*resource.Quantity{}
		}
		for name, q := range consumed {
			if total[id][string(name)] == nil {
				zero := resource.MustParse("0")
				total[id][string(name)] = &zero
			}
			total[id][string(name)].Add(q)
		}
	}
	for id, consumed := range state.AggregatedCapacity {
		m := map[resourceapi.QualifiedName]resource.Quantity{}
		for name, q := range consumed {
			m[name] = *q
		}
		add(id.String(), m)
	}
	for _, a := range results {
		for _, r := range a.Devices.Results {
			if r.ShareID != nil {
				add(structured.MakeDeviceID(r.Driver, r.Pool, r.Device).String(), r.ConsumedCapacity)
			}
		}
	}
	res.Consumed = map[string]map[string]string{}
	for id, byName := range total {
		res.Consumed[id] = map[string]string{}
		for name, q := range byName {
			res.Consumed[id][name] = fmt.Sprint(q.MilliValue())
		}
	}
	return res
}

// serveDRA answers every non-blank line of in on out, in order.
func serveDRA(in io.Reader, out io.Writer) error {
	ctx := context.Background()
	r := bufio.NewReaderSize(in, 1<<20)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	for {
		line, readErr := r.ReadBytes('\n')
		if len(line) > 0 && string(line) != "\n" {
			var c draCase
			var res draResult
			if err := json.Unmarshal(line, &c); err != nil {
				res = draResult{ID: c.ID, Outcome: "bad-input", Reason: err.Error()}
			} else {
				res = evalDRA(ctx, &c)
			}
			if err := enc.Encode(res); err != nil {
				return err
			}
			if err := w.Flush(); err != nil {
				return err
			}
		}
		if readErr != nil {
			if errors.Is(readErr, io.EOF) {
				return nil
			}
			return readErr
		}
	}
}
