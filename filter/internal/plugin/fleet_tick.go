package plugin

// Fleet rules on tick and at the ends of a policy and of the plugin: the quota
// client (filter/internal/fleetclient) reports, tops up and returns.

// fleetTick hands the fleet metrics to the host and lets the quota client do
// its periodic work (see fleetclient.Client.Tick).
func (p *pluginContext) fleetTick() {
	p.fleet.m.flush()
	if !p.cfg.ControlPlane.Enabled {
		return
	}
	p.ensureEnvoyID()
	p.fleet.client.Tick(clockNow())
}

// ensureEnvoyID sets the client's Envoy id once the hash key is known.
func (p *pluginContext) ensureEnvoyID() {
	if p.fleet.client.Envoy == "" && p.hashKeyOK {
		p.fleet.client.Envoy = envoyID(p.hashKey)
	}
}

// fleetPolicyChanged drops the quota client's records of keys whose rule the
// new policy removed, made envoy-scoped or changed (see
// fleetclient.Client.PolicyChanged). Their waiters are re-decided on the next
// tick, not here: a policy can be applied from a request's own callback (rule
// sync checks for one first), and re-deciding other streams would leave the
// effective context on them.
func (p *pluginContext) fleetPolicyChanged(old *policyState) {
	if old == nil || p.fleet.client == nil || p.fleet.client.Len() == 0 {
		return
	}
	p.fleet.client.PolicyChanged(func(id string) bool {
		after := p.fleetRuleByID(id)
		for i := range old.rules {
			if before := &old.rules[i]; before.cr.ID == id {
				return after != nil && before.cr.Fingerprint == after.cr.Fingerprint
			}
		}
		return false
	})
}

// fleetDone returns every unused unit this worker's keys hold, as the
// plugin goes away.
func (p *pluginContext) fleetDone() {
	if p.pol == nil || !p.cfg.ControlPlane.Enabled || p.fleet.client == nil {
		return
	}
	p.ensureEnvoyID()
	p.fleet.client.Done(clockNow())
	p.fleet.m.flush()
}
