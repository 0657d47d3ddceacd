"""Lists get a recipient mode. Every existing list becomes ``bcc``: its members stop seeing each
other's addresses, which is the safe change for lists whose members never agreed to be shown."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0005_kpi_partial_indexes'),
    ]

    operations = [
        migrations.AddField(
            model_name='notificationlist',
            name='recipient_mode',
            field=models.CharField(choices=[('bcc', 'Bcc: one message, no member sees another'), ('individual', 'Individual: one message per member'), ('to', 'To: one message, every member sees all the others')], default='bcc', help_text='How email reaches the members. Bcc (the default): one message whose visible To: is "undisclosed-recipients"; every member is an envelope recipient and none sees another\'s address. Individual: one message per member, addressed to that member alone, each with its own outcome. To: one message listing every member in To: (all members see each other; use only where that is wanted).', max_length=16),
        ),
    ]
