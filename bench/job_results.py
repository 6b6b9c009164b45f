"""What a finished eps job's master left in its --data-dir, read by the bench scripts.

    PYTHONPATH=bench /usr/bin/python3 -c 'from job_results import Job; print(Job(DIR).samples_per_s)'

samples_per_s is the first epoch's training records over the time from its start to its end
in the events log (parsing, pulls, pushes and commits included; the data scan and the
evaluation not).
"""
import json


class Job:
    def __init__(self, master_dir):
        self.events = [json.loads(line) for line in open(f"{master_dir}/events.jsonl")]
        self.final = json.load(open(f"{master_dir}/final_status.json"))

    def event(self, name):
        """The first event called `name`."""
        return next(e for e in self.events if e["event"] == name)

    @property
    def samples_per_s(self):
        seconds = self.event("epoch_finished")["time"] - self.event("epoch_started")["time"]
        return self.final["records_per_epoch"] / seconds

    @property
    def auc(self):
        return self.final["metrics"]["eval_auc"]
