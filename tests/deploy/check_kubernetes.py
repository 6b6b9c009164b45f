#!/usr/bin/python3
"""Static checks of deploy/kubernetes/ (there is no Kubernetes cluster here).

  check_kubernetes.py DEPLOY_KUBERNETES_DIR

Every manifest parses; the kustomization names files that exist; the Volcano
Job gang-schedules the master and every server (ps replicas = job.ini's
ps.num_servers); every volume, ConfigMap key, claim, service account and
Service the pods use exists, and the Service selects the master on the ports
it serves; and job.ini's launcher commands, run by sh with a stand-in
kubectl, create a worker pod that parses, carries its launch id, and uses
only verbs the master's Role grants. (That job.ini loads as an eps job file
is checked by tests/master/job_spec_test.cc.)
"""

import configparser
import os
import shlex
import stat
import subprocess
import sys
import tempfile

import yaml

VOLCANO_EVENTS = {"PodEvicted", "PodFailed", "TaskCompleted", "OutOfSync", "Unknown", "*"}
VOLCANO_ACTIONS = {"AbortJob", "RestartJob", "RestartTask", "TerminateJob", "CompleteJob",
                   "ResumeJob"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def load(path, named=True):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for doc in docs:
        check(doc.get("apiVersion") and doc.get("kind") and
              (not named or doc.get("metadata", {}).get("name")),
              f"{path}: a document without apiVersion, kind or metadata.name: {doc}")
    return docs


def flag(command, name):
    """The value after `name` in an argv list, or None."""
    return command[command.index(name) + 1] if name in command else None


def check_pod_spec(where, spec, objects, config_keys, keys_dir):
    check(spec.get("restartPolicy") in ("Never", "OnFailure", "Always"),
          f"{where}: restartPolicy missing")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for volume in volumes.values():
        if "configMap" in volume:
            check(volume["configMap"]["name"] in objects.get("ConfigMap", {}),
                  f"{where}: no ConfigMap {volume['configMap']['name']}")
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            check(claim in objects.get("PersistentVolumeClaim", {}),
                  f"{where}: no PersistentVolumeClaim {claim}")
    account = spec.get("serviceAccountName")
    if account:
        check(account in objects.get("ServiceAccount", {}), f"{where}: no ServiceAccount {account}")
    for container in spec["containers"]:
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        for name in mounts:
            check(name in volumes, f"{where}: mounts volume {name}, which it does not declare")
        command = container["command"]
        # Every eps process finds the job's keys where job.ini says.
        keys = [v for v in volumes.values() if "secret" in v and mounts.get(v["name"]) == keys_dir]
        check(len(keys) == 1, f"{where}: no Secret volume mounted at security.keys_dir {keys_dir}")
        config = flag(command, "--config")
        check(config is not None, f"{where}: {command[0]} without --config")
        if config:
            directory, key = os.path.split(config)
            check(mounts.get("config") == directory and key in config_keys,
                  f"{where}: --config {config} is not a key of the mounted ConfigMap")
        master = flag(command, "--master")
        if master:
            host, port = master.removeprefix("tcp://").rsplit(":", 1)
            service = objects.get("Service", {}).get(host)
            check(service is not None, f"{where}: --master {master}: no Service {host}")
            if service:
                check(int(port) in [p["port"] for p in service["spec"]["ports"]],
                      f"{where}: --master {master}: Service {host} has no port {port}")


def main(directory):
    kustomization = load(os.path.join(directory, "kustomization.yaml"), named=False)[0]
    objects = {}
    for resource in kustomization["resources"]:
        path = os.path.join(directory, resource)
        if check(os.path.exists(path), f"kustomization: no {resource}"):
            for doc in load(path):
                objects.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    config_keys = set()
    for generator in kustomization.get("configMapGenerator", []):
        for name in generator["files"]:
            check(os.path.exists(os.path.join(directory, name)), f"kustomization: no file {name}")
            config_keys.add(name)
        objects.setdefault("ConfigMap", {})[generator["name"]] = generator
    check(kustomization.get("generatorOptions", {}).get("disableNameSuffixHash"),
          "kustomization: the ConfigMap name must stay as the pods write it")

    job_ini = configparser.ConfigParser(interpolation=None)
    job_ini.read(os.path.join(directory, "job.ini"))
    keys_dir = job_ini.get("security", "keys_dir", fallback="")
    check(job_ini.get("security", "mode", fallback="curve") == "curve" and keys_dir,
          "job.ini: [security] keys_dir must name the mounted Secret (mode curve)")

    # The Volcano Job: master and ps tasks, gang-scheduled.
    jobs = objects.get("Job", {})
    check(len(jobs) == 1, f"expected one Volcano Job, found {list(jobs)}")
    job = next(iter(jobs.values()))
    check(job["apiVersion"] == "batch.volcano.sh/v1alpha1", "the Job is not a Volcano Job")
    tasks = {t["name"]: t for t in job["spec"]["tasks"]}
    check(set(tasks) >= {"master", "ps"}, f"tasks {list(tasks)}: master and ps expected")
    check(tasks["master"]["replicas"] == 1, "one master")
    check(tasks["ps"]["replicas"] == int(job_ini["ps"]["num_servers"]),
          "ps replicas differ from job.ini ps.num_servers")
    check(job["spec"]["minAvailable"] == tasks["master"]["replicas"] + tasks["ps"]["replicas"],
          "minAvailable must gang-schedule the master and every server")
    for policy in job["spec"].get("policies", []) + [
            p for t in tasks.values() for p in t.get("policies", [])]:
        check(policy["event"] in VOLCANO_EVENTS and policy["action"] in VOLCANO_ACTIONS,
              f"not a Volcano policy: {policy}")
    for name, task in tasks.items():
        check_pod_spec(f"task {name}", task["template"]["spec"], objects, config_keys, keys_dir)

    # The Service selects the master, on the ports the master serves.
    master_template = tasks["master"]["template"]
    master_command = master_template["spec"]["containers"][0]["command"]
    service = objects["Service"]["eps-ctr-master"]
    labels = master_template["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in service["spec"]["selector"].items()),
          "the Service does not select the master's pods")
    service_ports = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    check(service_ports.get("rpc") == int(flag(master_command, "--port")), "rpc port differs")
    check(service_ports.get("http") == int(flag(master_command, "--http-port")), "http port differs")
    check(job_ini["master"]["bind_host"] == "0.0.0.0", "the master must bind every interface")

    # The master may create and delete pods.
    account = master_template["spec"]["serviceAccountName"]
    bindings = [b for b in objects.get("RoleBinding", {}).values()
                if any(s["name"] == account for s in b["subjects"])]
    verbs = set()
    for binding in bindings:
        role = objects.get("Role", {}).get(binding["roleRef"]["name"])
        if check(role is not None, f"RoleBinding {binding['metadata']['name']}: no Role"):
            for rule in role["rules"]:
                if "pods" in rule["resources"]:
                    verbs.update(rule["verbs"])

    # The launcher's commands, as the master runs them (sh), with a
    # stand-in kubectl that records its calls and prints what kubectl does.
    autoscale = job_ini["autoscale"]
    check(autoscale["launcher"] == "command", "launcher = command expected")
    with tempfile.TemporaryDirectory() as scratch:
        etc = os.path.join(scratch, "etc-eps")
        os.makedirs(etc)
        for key in config_keys:
            with open(os.path.join(directory, key)) as src, open(os.path.join(etc, key), "w") as dst:
                dst.write(src.read())
        kubectl = os.path.join(scratch, "kubectl")
        calls = os.path.join(scratch, "calls")
        with open(kubectl, "w") as f:
            f.write("#!/bin/sh\n"
                    f"echo \"$*\" >> {calls}\n"
                    "if [ \"$1\" = create ]; then\n"
                    f"  cat > {scratch}/created.yaml\n"
                    f"  printf 'pod/%s\\n' \"$(sed -n 's/^  name: //p' {scratch}/created.yaml | head -1)\"\n"
                    "fi\n")
        os.chmod(kubectl, stat.S_IRWXU)
        env = dict(os.environ, PATH=f"{scratch}:{os.environ['PATH']}")

        def run(template, **values):
            command = template.replace("/etc/eps/", etc + "/")
            # As the master does: each value shell-quoted.
            for key, value in values.items():
                command = command.replace("{" + key + "}", shlex.quote(value))
            check("{" not in command.replace("${", ""), f"unfilled placeholder in {command}")
            return subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True,
                                  text=True, timeout=30)

        started = run(autoscale["start_command"], id="1234567", secret="00ff" * 16,
                      master="tcp://unused:1", config="/unused")
        check(started.returncode == 0, f"start_command failed: {started.stderr}")
        handle = started.stdout.strip().splitlines()[0] if started.stdout.strip() else ""
        check(handle == "pod/eps-ctr-worker-1234567", f"start_command printed {handle!r}")
        with open(os.path.join(scratch, "created.yaml")) as f:
            pod = yaml.safe_load(f)
        check(pod["kind"] == "Pod", "the worker template is not a Pod")
        env_vars = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        check(env_vars.get("EPS_LAUNCH_ID") == "1234567", "the worker pod lacks its EPS_LAUNCH_ID")
        check(env_vars.get("EPS_LAUNCH_SECRET") == "00ff" * 16,
              "the worker pod lacks its EPS_LAUNCH_SECRET")
        check("@LAUNCH_ID@" not in yaml.safe_dump(pod), "a @LAUNCH_ID@ placeholder was left")
        check_pod_spec("worker pod", pod["spec"], objects, config_keys, keys_dir)
        check(pod["spec"]["containers"][0]["command"][0] == "eps-worker", "the pod runs eps-worker")
        for signal, wanted in (("TERM", []), ("KILL", ["--grace-period=0", "--force"])):
            stopped = run(autoscale["stop_command"], id="1234567", handle=handle, signal=signal)
            check(stopped.returncode == 0, f"stop_command ({signal}) failed: {stopped.stderr}")
        with open(calls) as f:
            lines = f.read().splitlines()
        check(len(lines) == 3, f"kubectl calls: {lines}")
        if len(lines) == 3:
            check(lines[1].startswith(f"delete {handle}") and "--force" not in lines[1],
                  f"TERM stop: {lines[1]}")
            check(lines[2].startswith(f"delete {handle}") and "--force" in lines[2],
                  f"KILL stop: {lines[2]}")
        for line in lines:
            check(line.split()[0] in verbs, f"kubectl {line.split()[0]}: not granted by the Role")

    for failure in failures:
        print("FAIL:", failure)
    counted = sum(len(v) for v in objects.values())
    print(f"{counted} objects checked, {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
