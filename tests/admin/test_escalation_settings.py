"""A list's acknowledgement and escalation settings in the console's list form and in the
configuration file: saved when valid, refused with a clear message when not (steps' shape,
after_seconds above 0 and increasing, an existing list with targets for the step's channel,
no loop back to the list), exported and imported."""

import json

import pytest
from django.urls import reverse

from notifications.checks import check_escalations
from notifications.config_file import ConfigFileError, configuration_export, configuration_import
from notifications.escalation import escalation_loop
from notifications.models import EmailRecipient, NotificationList, SmsTarget
from tests.admin.conftest import login, make_user

INLINES = ("email_recipients", "teams_targets", "webhook_targets", "sms_targets", "apprise_targets")


@pytest.fixture
def admin_client_(client, db):
    login(client, make_user("adam", groups=["Administrators"]))
    return client


@pytest.fixture
def leads(db):
    leads = NotificationList.objects.create(name="Shift-Leads")
    SmsTarget.objects.create(notification_list=leads, phone_number="+4930123456")
    return leads


def list_form(name="Operators", escalation="", repeat=0, ack="high"):
    data = {
        "name": name,
        "description": "",
        "recipient_mode": "bcc",
        "ack_required_from": ack,
        "escalation": escalation if isinstance(escalation, str) else json.dumps(escalation),
        "repeat_last_every_seconds": str(repeat),
    }
    for prefix in INLINES:
        data[f"{prefix}-TOTAL_FORMS"] = "0"
        data[f"{prefix}-INITIAL_FORMS"] = "0"
    return data


def page_text(response):
    return response.content.decode().replace("&#x27;", "'").replace("&quot;", '"')


def step(after, target="Shift-Leads", channel="sms"):
    return {"after_seconds": after, "list": target, "type": channel}


# --- the console ----------------------------------------------------------------------------------


def test_an_administrator_sets_acknowledgement_steps_and_repeat(admin_client_, leads):
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"),
        list_form(escalation=[step(300), step(900)], repeat=600, ack="critical"),
    )
    assert response.status_code == 302, response.context and response.context["adminform"].form.errors
    operators = NotificationList.objects.get(name="Operators")
    assert operators.escalation == [step(300), step(900)]
    assert (operators.repeat_last_every_seconds, operators.ack_required_from) == (600, "critical")


def test_a_list_saved_without_the_new_fields_keeps_no_escalation(admin_client_):
    data = list_form()
    for name in ("ack_required_from", "escalation", "repeat_last_every_seconds"):
        del data[name]
    assert admin_client_.post(reverse("admin:notifications_notificationlist_add"), data).status_code == 302
    operators = NotificationList.objects.get(name="Operators")
    assert (operators.escalation, operators.repeat_last_every_seconds, operators.ack_required_from) == ([], 0, "high")


@pytest.mark.parametrize(
    ("escalation", "repeat", "message"),
    [
        ("[{", 0, "Enter a valid JSON"),
        ({"after_seconds": 300}, 0, "Escalation must be a list of steps"),
        ([{"after_seconds": 300, "list": "Shift-Leads"}], 0, 'Step 1 must have exactly "after_seconds", "list"'),
        ([step(0)], 0, "Step 1: after_seconds must be a whole number of seconds above 0."),
        ([step(600), step(300)], 0, "Step 2: after_seconds (300) must be more than the step before (600)"),
        ([step(300, target="Nobody")], 0, "Step 1: there is no list named 'Nobody'."),
        ([step(300, channel="teams")], 0, "Step 1: the list 'Shift-Leads' has no targets for the channel 'teams'"),
        ([], 600, "repeat_last_every_seconds repeats the last escalation step: there is none."),
    ],
)
def test_bad_escalation_steps_are_a_clear_field_error_and_nothing_is_saved(
    admin_client_, leads, escalation, repeat, message
):
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_add"), list_form(escalation=escalation, repeat=repeat)
    )
    assert response.status_code == 200
    assert message in page_text(response)
    assert not NotificationList.objects.filter(name="Operators").exists()


def test_a_list_cannot_escalate_back_to_itself_through_another_lists_steps(admin_client_, leads):
    operators = NotificationList.objects.create(name="Operators")
    EmailRecipient.objects.create(notification_list=operators, email="op@example.com")
    leads.escalation = [step(60, target="Operators", channel="email")]
    leads.save()
    response = admin_client_.post(
        reverse("admin:notifications_notificationlist_change", args=[operators.pk]),
        list_form(escalation=[step(300)]),
    )
    assert response.status_code == 200
    assert "Escalation would loop back to this list: Operators → Shift-Leads → Operators." in page_text(response)
    assert NotificationList.objects.get(pk=operators.pk).escalation == []


def test_a_loop_is_found_however_long_and_a_chain_is_not_a_loop():
    lists = {"A": [step(1, "B")], "B": [step(1, "C")], "C": [step(1, "a")], "D": []}
    assert escalation_loop(start="A", lists=lists) == ["A", "B", "C", "A"]
    assert escalation_loop(start="A", lists={**lists, "C": [step(1, "D")]}) == []


# --- the configuration file -----------------------------------------------------------------------


def test_the_configuration_file_imports_and_exports_acknowledgement_and_escalation(db):
    data = {
        "lists": [
            {"name": "Shift-Leads", "sms": ["+4930123456"]},
            {
                "name": "Operators",
                "email": ["op@example.com"],
                "ack_required_from": "normal",
                "escalation": [step(300), step(900)],
                "repeat_last_every_seconds": 600,
            },
        ]
    }
    configuration_import(data=data)
    operators = NotificationList.objects.get(name="Operators")
    assert (operators.ack_required_from, operators.escalation, operators.repeat_last_every_seconds) == (
        "normal",
        [step(300), step(900)],
        600,
    )
    (exported,) = [entry for entry in configuration_export()["lists"] if entry["name"] == "Operators"]
    assert exported["escalation"] == [step(300), step(900)]
    assert (exported["ack_required_from"], exported["repeat_last_every_seconds"]) == ("normal", 600)


@pytest.mark.parametrize(
    ("operators", "message"),
    [
        ({"ack_required_from": "urgent"}, "lists[1] ('Operators').ack_required_from: 'urgent' is not one of"),
        ({"escalation": [step(300, channel="webhook")]}, "has no targets for the channel 'webhook' (it has: sms)"),
        ({"escalation": [step(300, target="Nobody")]}, "Step 1: there is no list named 'Nobody'."),
        ({"escalation": "soon"}, "lists[1] ('Operators').escalation: Escalation must be a list of steps"),
        ({"escalation": [step(300)], "repeat_last_every_seconds": -5}, ".repeat_last_every_seconds: "),
    ],
)
def test_a_configuration_file_with_bad_escalation_is_refused_naming_the_entry(db, operators, message):
    data = {"lists": [{"name": "Shift-Leads", "sms": ["+4930123456"]}, {"name": "Operators", **operators}]}
    with pytest.raises(ConfigFileError) as refused:
        configuration_import(data=data)
    assert any(message in problem for problem in refused.value.problems), refused.value.problems
    assert not NotificationList.objects.exists()


def test_a_configuration_file_that_makes_two_lists_escalate_to_each_other_is_refused(db):
    data = {
        "lists": [
            {"name": "Shift-Leads", "email": ["lead@example.com"], "escalation": [step(60, "Operators", "email")]},
            {"name": "Operators", "email": ["op@example.com"], "escalation": [step(60, "Shift-Leads", "email")]},
        ]
    }
    with pytest.raises(ConfigFileError) as refused:
        configuration_import(data=data)
    assert any("Escalation would loop back to this list" in problem for problem in refused.value.problems)


def test_a_step_to_a_list_whose_targets_the_file_removes_is_refused(db, leads):
    data = {"lists": [{"name": "Shift-Leads", "sms": []}, {"name": "Operators", "escalation": [step(300)]}]}
    with pytest.raises(ConfigFileError) as refused:
        configuration_import(data=data)
    assert any("has no targets for the channel 'sms'" in problem for problem in refused.value.problems)


def test_a_file_that_removes_the_targets_a_stored_lists_step_uses_is_refused(db, leads):
    NotificationList.objects.create(name="Operators", escalation=[step(300)])
    with pytest.raises(ConfigFileError) as refused:
        configuration_import(data={"lists": [{"name": "Shift-Leads", "sms": []}]})
    assert refused.value.problems == [
        "lists: the list 'Operators' (not in this file) would escalate wrongly: Step 1: the list 'Shift-Leads' has "
        "no targets for the channel 'sms' (it has: none)."
    ]
    assert leads.sms_targets.exists()
    configuration_import(data={"lists": [{"name": "Shift-Leads", "email": ["lead@example.com"]}]})  # sms kept: fine


def test_a_system_check_warns_of_a_step_whose_list_lost_its_targets(db, leads):
    NotificationList.objects.create(name="Operators", escalation=[step(300)])
    assert check_escalations(databases=["default"]) == []
    leads.sms_targets.all().delete()  # on the Shift-Leads page, after the steps were saved
    (warning,) = check_escalations(databases=["default"])
    assert warning.id == "outbox.W030"
    assert "The escalation of the list 'Operators' cannot be taken as configured: Step 1: the list 'Shift-Leads' " in (
        warning.msg
    )
