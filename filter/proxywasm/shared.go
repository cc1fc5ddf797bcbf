package proxywasm

// Shared data and shared queues (spec v0.2.1 "Shared data", "Shared queues";
// Envoy semantics in docs/ENVOY.md, Shared data). Shared data is one
// key-value map per Envoy process and vm_id, seen by every worker VM; keys
// cannot be deleted.

// GetSharedData returns the value of key and its cas with
// proxy_get_shared_data. Pass cas to SetSharedData to write only if nobody
// wrote in between. An empty value is (nil, cas, nil).
//
// Errors: ErrNotFound if key was never set.
func GetSharedData(key string) (value []byte, cas uint32, err error) {
	value, cas, st := hostGetSharedData(key)
	if err := statusError(st); err != nil {
		return nil, 0, err
	}
	return value, cas, nil
}

// SetSharedData stores value under key with proxy_set_shared_data. With
// cas 0 the write is unconditional; otherwise it succeeds only if cas is
// the key's current cas (a new key is always created). Envoy draws cas
// values from one process-wide counter that skips 0, so they are opaque.
//
// Errors: ErrCasMismatch if cas is stale: re-read and retry.
func SetSharedData(key string, value []byte, cas uint32) error {
	return statusError(hostSetSharedData(key, value, cas))
}

// RegisterSharedQueue creates (or re-registers) the queue name in this
// VM's vm_id with proxy_register_shared_queue and returns its id.
// Enqueues then call PluginContext.OnQueueReady of the current root
// context; in Envoy the latest registrant receives the notifications.
func RegisterSharedQueue(name string) (queueID uint32, err error) {
	id, st := hostRegisterSharedQueue(name)
	if err := statusError(st); err != nil {
		return 0, err
	}
	return id, nil
}

// ResolveSharedQueue returns the id of queue name registered under vmID
// (empty: this VM's vm_id), with proxy_resolve_shared_queue.
//
// Errors: ErrNotFound if the queue was never registered.
func ResolveSharedQueue(vmID, name string) (queueID uint32, err error) {
	id, st := hostResolveSharedQueue(vmID, name)
	if err := statusError(st); err != nil {
		return 0, err
	}
	return id, nil
}

// EnqueueSharedQueue appends data to a queue with
// proxy_enqueue_shared_queue. Errors: ErrNotFound for an unknown queue id.
func EnqueueSharedQueue(queueID uint32, data []byte) error {
	return statusError(hostEnqueueSharedQueue(queueID, data))
}

// DequeueSharedQueue removes and returns the oldest item of a queue with
// proxy_dequeue_shared_queue.
//
// Errors: ErrEmpty if the queue is empty; ErrNotFound for an unknown id.
func DequeueSharedQueue(queueID uint32) ([]byte, error) {
	b, st := hostDequeueSharedQueue(queueID)
	if err := statusError(st); err != nil {
		return nil, err
	}
	return b, nil
}
